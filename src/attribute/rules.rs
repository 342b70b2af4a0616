//! Custom rules: a TOML file of ordered regex rules that set labels.
//!
//! ```toml
//! [[rule]]
//! file = "models/.*\\.py$"      # regex on a frame's file (optional)
//! function = "^attention"       # regex on the same frame's function (optional)
//! lines = [100, 140]            # inclusive line range of that frame (optional)
//! category = "activation"       # any of: category, stage, op, phase, detail
//! stage = "attention"
//! ```
//!
//! A rule matches an allocation when one frame of its stack satisfies all of the rule's
//! conditions. For each label, the first matching rule that sets it wins, over the preset.
//! Rules are compiled against the snapshot's stack table once, so each event costs a lookup.

use std::collections::HashMap;

use regex::Regex;
use serde::Deserialize;

use super::{Category, Label, Labels, Names, Phase};
use crate::replay::Replay;
use crate::snapshot::{Action, Snapshot, StackId};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    file: Option<String>,
    function: Option<String>,
    lines: Option<[u32; 2]>,
    category: Option<String>,
    stage: Option<String>,
    op: Option<String>,
    phase: Option<String>,
    detail: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    rule: Vec<RawRule>,
}

#[derive(Clone, Debug)]
struct Rule {
    file: Option<Regex>,
    function: Option<Regex>,
    lines: Option<(u32, u32)>,
    category: Option<Category>,
    stage: Option<String>,
    op: Option<String>,
    phase: Option<Phase>,
    detail: Option<String>,
}

/// Compiled custom rules.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

fn parse_phase(s: &str) -> Option<Phase> {
    Some(match s {
        "forward" => Phase::Forward,
        "backward" => Phase::Backward,
        "optimizer" => Phase::Optimizer,
        "communication" => Phase::Communication,
        "other" => Phase::Other,
        _ => return None,
    })
}

/// The most rules a file may hold.
pub use crate::error::options::MAX_RULES;
pub use crate::error::RulesError;
/// The most memory one compiled pattern may take (and its lazy DFA's cache).
const PATTERN_SIZE_LIMIT: usize = 1 << 20;
/// The most memory all of a file's compiled patterns may take together, caches included: a
/// file of many rules gives each pattern a share of it.
const RULES_MEMORY: usize = 32 << 20;
/// The longest pattern text read: the regex parser's syntax tree costs tens of bytes per
/// character before any size limit applies.
pub const MAX_PATTERN_BYTES: usize = 16 << 10;

/// What each pattern of a file of `patterns` patterns may take, compiled and cached.
fn pattern_limit(patterns: usize) -> usize {
    (RULES_MEMORY / 2 / patterns.max(1)).min(PATTERN_SIZE_LIMIT)
}

/// A rule's pattern, compiled within `limit` bytes; the parser's error on one line.
fn pattern(p: &str, limit: usize) -> Result<Regex, String> {
    if p.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "{} long; a pattern may have at most {}",
            crate::units::bytes(p.len() as u64),
            crate::units::bytes(MAX_PATTERN_BYTES as u64)
        ));
    }
    regex::RegexBuilder::new(p)
        .size_limit(limit)
        .dfa_size_limit(limit)
        .build()
        .map_err(|e| match e {
            regex::Error::Syntax(text) => {
                // "regex parse error:\n    PATTERN\n    ^^^\nerror: WHAT": keep WHAT.
                let what = text
                    .lines()
                    .rev()
                    .find_map(|l| l.strip_prefix("error: "))
                    .unwrap_or("syntax error");
                what.trim().to_string()
            }
            regex::Error::CompiledTooBig(limit) => format!(
                "it compiles to more than {}, the most a pattern may take in this file",
                crate::units::bytes(limit as u64)
            ),
            other => crate::units::one_line(&other.to_string()),
        })
}

/// A TOML error as line, column and the reader's first words.
fn toml_error(text: &str, e: &toml::de::Error) -> RulesError {
    let at = e.span().map_or(0, |s| s.start).min(text.len());
    let at = (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    RulesError::Toml {
        line,
        column,
        message: crate::units::one_line(e.message()),
    }
}

impl RuleSet {
    /// Parses rules from TOML text; errors name the rule and the field.
    pub fn parse(text: &str) -> Result<RuleSet, RulesError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        if raw.rule.len() > MAX_RULES {
            return Err(RulesError::TooMany(raw.rule.len()));
        }
        let patterns = raw
            .rule
            .iter()
            .map(|r| r.file.is_some() as usize + r.function.is_some() as usize)
            .sum();
        let limit = pattern_limit(patterns);
        let mut rules = Vec::new();
        for (i, r) in raw.rule.into_iter().enumerate() {
            let n = i + 1;
            let re =
                |field: &'static str, s: &Option<String>| -> Result<Option<Regex>, RulesError> {
                    s.as_deref()
                        .map(|p| {
                            pattern(p, limit).map_err(|message| RulesError::Pattern {
                                rule: n,
                                field,
                                message,
                            })
                        })
                        .transpose()
                };
            let unknown = |field: &'static str, value: &str| RulesError::UnknownName {
                rule: n,
                field,
                value: value.to_string(),
            };
            let category = r
                .category
                .as_deref()
                .map(|c| Category::parse(c).ok_or_else(|| unknown("category", c)))
                .transpose()?;
            let phase = r
                .phase
                .as_deref()
                .map(|p| parse_phase(p).ok_or_else(|| unknown("phase", p)))
                .transpose()?;
            if r.category.is_none()
                && r.stage.is_none()
                && r.op.is_none()
                && r.phase.is_none()
                && r.detail.is_none()
            {
                return Err(RulesError::NoLabel(n));
            }
            rules.push(Rule {
                file: re("file", &r.file)?,
                function: re("function", &r.function)?,
                lines: r.lines.map(|[a, b]| (a, b)),
                category,
                stage: r.stage,
                op: r.op,
                phase,
                detail: r.detail,
            });
        }
        Ok(RuleSet { rules })
    }

    fn matches(&self, rule: &Rule, snap: &Snapshot, stack: StackId) -> bool {
        snap.stacks.frames(stack).any(|f| {
            rule.file
                .as_ref()
                .is_none_or(|r| r.is_match(snap.str(f.filename)))
                && rule
                    .function
                    .as_ref()
                    .is_none_or(|r| r.is_match(snap.str(f.name)))
                && rule.lines.is_none_or(|(a, b)| a <= f.line && f.line <= b)
        })
    }

    /// The overrides for one stack: for each label, the first rule that sets it.
    fn resolve(&self, snap: &Snapshot, stack: StackId) -> Vec<usize> {
        (0..self.rules.len())
            .filter(|&i| self.matches(&self.rules[i], snap, stack))
            .collect()
    }

    fn set(&self, matched: &[usize], names: &mut Names, l: &mut Label) {
        let mut done = [false; 5];
        for &i in matched {
            let r = &self.rules[i];
            if let (false, Some(c)) = (done[0], r.category) {
                l.category = c;
                done[0] = true;
            }
            if let (false, Some(s)) = (done[1], &r.stage) {
                l.stage = names.intern(s);
                done[1] = true;
            }
            if let (false, Some(s)) = (done[2], &r.op) {
                l.op = names.intern(s);
                done[2] = true;
            }
            if let (false, Some(p)) = (done[3], r.phase) {
                l.phase = p;
                done[3] = true;
            }
            if let (false, Some(s)) = (done[4], &r.detail) {
                l.detail = names.intern(s);
                done[4] = true;
            }
        }
    }

    /// Applies the rules to every allocation and pre-existing block.
    pub(crate) fn apply(
        &self,
        snap: &Snapshot,
        replay: &Replay,
        names: &mut Names,
        labels: &mut Labels,
        preexisting: &mut Labels,
    ) {
        let mut cache: HashMap<StackId, Vec<usize>> = HashMap::new();
        let events = snap.trace(replay.device);
        for (i, e) in events.iter().enumerate() {
            if e.action != Action::Alloc {
                continue;
            }
            let matched = cache
                .entry(e.stack)
                .or_insert_with(|| self.resolve(snap, e.stack))
                .clone();
            labels.update(i, |l| self.set(&matched, names, l));
        }
        for (k, p) in replay.preexisting.iter().enumerate() {
            let matched = cache
                .entry(p.stack)
                .or_insert_with(|| self.resolve(snap, p.stack))
                .clone();
            preexisting.update(k, |l| self.set(&matched, names, l));
        }
        // frees follow their allocation's category
        for (i, e) in events.iter().enumerate() {
            if e.action != Action::Alloc {
                let p = replay.partner[i];
                if p != crate::replay::NONE && p & crate::replay::PREEXISTING == 0 {
                    let category = labels[p as usize].category;
                    labels.update(i, |l| l.category = category);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rules_and_report_errors() {
        let ok = RuleSet::parse(
            r#"
            [[rule]]
            file = "models/.*\\.py$"
            function = "^attn"
            lines = [10, 20]
            category = "activation"
            stage = "attention"
            [[rule]]
            function = "adam"
            phase = "optimizer"
            "#,
        )
        .unwrap();
        assert_eq!(ok.rules.len(), 2);
        assert_eq!(ok.rules[0].lines, Some((10, 20)));
        let e = RuleSet::parse("[[rule]]\nfunction = \"(\"\nstage = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("rule 1: function:"), "{e}");
        let e = RuleSet::parse("[[rule]]\ncategory = \"weights\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown category"), "{e}");
        let e = RuleSet::parse("[[rule]]\nfile = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sets no label"), "{e}");
        assert!(RuleSet::parse("[[rule]]\nbogus = 1").is_err());
    }

    #[test]
    fn patterns_share_one_memory_budget() {
        // a file of few rules gives each pattern the full limit, a file of many a share
        assert_eq!(pattern_limit(1), PATTERN_SIZE_LIMIT);
        assert!(pattern_limit(2_000) * 2_000 <= RULES_MEMORY / 2);
        assert!(pattern_limit(2_000) >= 8 << 10);
        let rule = "[[rule]]\nfunction = \"^\\\\w{4}$\"\nstage = \"s\"\n";
        assert!(RuleSet::parse(rule).is_ok());
        let e = RuleSet::parse(&rule.repeat(1_000)).unwrap_err().to_string();
        assert!(e.contains("the most a pattern may take"), "{e}");
        // the text's length is checked before the parser builds its tree
        let long = format!(
            "[[rule]]\nfile = \"{}\"\nstage = \"s\"\n",
            "a".repeat(MAX_PATTERN_BYTES + 1)
        );
        let e = RuleSet::parse(&long).unwrap_err().to_string();
        assert!(e.contains("a pattern may have at most 16.00 KiB"), "{e}");
    }
}
