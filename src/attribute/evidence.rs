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

impl Best {
    fn add(&mut self, evidence: Evidence, category: Category) {
        if evidence > self.evidence {
            *self = Best {
                evidence,
                category,
                conflict: false,
            };
        } else if evidence == self.evidence && category != self.category {
            self.conflict = true;
        }
    }
}

/// Fewest events [`Ledger::add_each`] gives a thread: fewer are not worth handing over.
const MIN_RANGE: usize = 1 << 14;

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
        if let Some(b) = self.best.get_mut(i) {
            b.add(evidence, category);
        }
    }

    /// Adds the evidence `each` gives each event (by index), for the events in as many ranges
    /// as there are threads, side by side; `each` takes a state of its own in each range, made
    /// by `init`. The same as adding the events' evidence one by one, in any order: the ledger
    /// keeps the strongest evidence, and notes a conflict between equals whatever their order.
    pub(crate) fn add_each<S>(
        &mut self,
        init: impl Fn() -> S + Sync,
        each: impl Fn(&mut S, usize) -> Option<(Evidence, Category)> + Sync,
    ) {
        use rayon::prelude::*;
        let threads = rayon::current_num_threads().max(1);
        let per = self.best.len().div_ceil(threads).max(MIN_RANGE);
        self.best
            .par_chunks_mut(per)
            .enumerate()
            .for_each(|(c, part)| {
                let mut state = init();
                for (k, b) in part.iter_mut().enumerate() {
                    if let Some((evidence, category)) = each(&mut state, c * per + k) {
                        b.add(evidence, category);
                    }
                }
            });
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

    #[test]
    fn evidence_added_in_ranges_side_by_side_is_evidence_added_one_by_one() {
        let n = 5 * MIN_RANGE + 123;
        let categories = [
            Category::Activation,
            Category::Gradient,
            Category::Temporary,
        ];
        let strengths = [Evidence::Life, Evidence::Code];
        // what each event is told, from a fixed sequence (a few events told nothing)
        let told = |i: usize| {
            let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            (!x.is_multiple_of(7)).then(|| {
                (
                    strengths[(x >> 3) as usize % 2],
                    categories[(x >> 5) as usize % 3],
                )
            })
        };
        let mut want = Ledger::new(n);
        let mut got = Ledger::new(n);
        // evidence already there: some stronger, some as strong and of another category
        for l in [&mut want, &mut got] {
            for i in (0..n).step_by(5) {
                l.add(i, Evidence::Code, Category::Activation);
            }
        }
        for i in 0..n {
            if let Some((e, c)) = told(i) {
                want.add(i, e, c);
            }
        }
        let ranges = std::sync::Mutex::new(Vec::new());
        got.add_each(|| ranges.lock().unwrap().push(()), |_, i| told(i));
        for i in 0..n {
            assert_eq!(got.decision(i), want.decision(i), "event {i}");
        }
        assert!(want.best.iter().any(|b| b.conflict));
        assert!(!ranges.lock().unwrap().is_empty());
    }
}
