//! Evidence for categories, and the one place that decides them.
//!
//! Each source of evidence only adds what it saw about an allocation: the program's own list of
//! its tensors (`capture`), PyTorch's labels (`category::apply_labels`), the
//! code PyTorch ran when it made or freed the block (`code_paths`), and the block's
//! life over the phases (`category`). `Ledger` keeps, per allocation, the strongest
//! evidence seen and whether evidence of that strength disagreed; `Ledger::decision` is where
//! categories are decided (`category::settle` sets them): the strongest evidence wins, and
//! evidence of equal strength that contradicts itself gives `unknown` rather than a guess.

use serde::Serialize;

use super::Category;

/// What decided a category, weakest first: a stronger kind overrides a weaker one.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// Nothing: the category is `unknown`.
    #[default]
    None,
    /// Evidence of equal strength disagreed: the category is `unknown`.
    Conflict,
    /// Alive before the trace started, and nothing else is known of it.
    BeforeTrace,
    /// When the block was made and freed, by phase (activations freed by backward,
    /// temporaries freed where they were made, state kept across updates).
    Life,
    /// The code PyTorch (or a library around it) ran when the block was made or freed: a
    /// module being set up, an optimizer initialising its state, `zero_grad` dropping
    /// gradients, gradient accumulation, DDP's buckets, collectives, recomputation, a
    /// library's workspace, the program moving data to the device.
    Code,
    /// PyTorch's own labels: an `annotate` entry or memory metadata naming a category.
    Label,
    /// The program's own list of its tensors (`memsnap.Capture`'s `.tensors.json`).
    Capture,
    /// A custom rule (`--rules`).
    Rules,
}

impl Evidence {
    /// Every kind, in the order reports list them (strongest first).
    pub const ALL: [Evidence; 8] = [
        Evidence::Rules,
        Evidence::Capture,
        Evidence::Label,
        Evidence::Code,
        Evidence::Life,
        Evidence::BeforeTrace,
        Evidence::Conflict,
        Evidence::None,
    ];

    /// Lower-case name, as in the JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::None => "none",
            Evidence::Conflict => "conflicting",
            Evidence::BeforeTrace => "before the trace",
            Evidence::Life => "lifetime",
            Evidence::Code => "code path",
            Evidence::Label => "PyTorch label",
            Evidence::Capture => "capture",
            Evidence::Rules => "rules",
        }
    }
}

/// The strongest evidence seen for one allocation.
#[derive(Clone, Copy, Debug, Default)]
struct Best {
    evidence: Evidence,
    category: Category,
    /// Evidence of the same strength named another category.
    conflict: bool,
}

/// Evidence per allocation (by event index), as the sources add it.
#[derive(Debug)]
pub(crate) struct Ledger {
    best: Vec<Best>,
}

impl Ledger {
    /// An empty ledger for a trace of `n` events.
    pub(crate) fn new(n: usize) -> Ledger {
        Ledger {
            best: vec![Best::default(); n],
        }
    }

    /// Adds what `evidence` says of allocation `i`.
    pub(crate) fn add(&mut self, i: usize, evidence: Evidence, category: Category) {
        let Some(b) = self.best.get_mut(i) else {
            return;
        };
        if evidence > b.evidence {
            *b = Best {
                evidence,
                category,
                conflict: false,
            };
        } else if evidence == b.evidence && category != b.category {
            b.conflict = true;
        }
    }

    /// The category the evidence so far gives allocation `i` (`None` when it has none or it
    /// conflicts), with the evidence's strength.
    pub(crate) fn current(&self, i: usize) -> Option<(Category, Evidence)> {
        let b = self.best.get(i)?;
        (b.evidence > Evidence::BeforeTrace && !b.conflict).then_some((b.category, b.evidence))
    }

    /// The category and evidence allocation `i` ends with: the strongest evidence, or
    /// `unknown` where it is missing or contradicts itself (`None` past the ledger's end).
    pub(crate) fn decision(&self, i: usize) -> Option<(Category, Evidence)> {
        let b = self.best.get(i)?;
        Some(if b.conflict {
            (Category::Unknown, Evidence::Conflict)
        } else if b.evidence == Evidence::None {
            (Category::Unknown, Evidence::None)
        } else {
            (b.category, b.evidence)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strongest_wins_and_equals_that_disagree_give_unknown() {
        let mut l = Ledger::new(3);
        l.add(0, Evidence::Life, Category::Activation);
        l.add(0, Evidence::Code, Category::Parameter);
        l.add(0, Evidence::Life, Category::Temporary);
        l.add(1, Evidence::Code, Category::Input);
        l.add(1, Evidence::Code, Category::Parameter);
        l.add(1, Evidence::Capture, Category::Parameter);
        l.add(2, Evidence::Code, Category::Gradient);
        l.add(2, Evidence::Code, Category::Communication);
        let ledger_with_extra = {
            let mut l2 = Ledger::new(4);
            l2.best[..3].copy_from_slice(&l.best);
            l2
        };
        let d = |i| ledger_with_extra.decision(i);
        assert_eq!(d(0), Some((Category::Parameter, Evidence::Code)));
        assert_eq!(d(1), Some((Category::Parameter, Evidence::Capture)));
        assert_eq!(d(2), Some((Category::Unknown, Evidence::Conflict)));
        assert_eq!(d(3), Some((Category::Unknown, Evidence::None)));
        assert_eq!(d(4), None);
        assert_eq!(l.current(2), None);
        assert_eq!(l.current(0), Some((Category::Parameter, Evidence::Code)));
    }
}
