//! Colours that stay the same for the same label in every chart, so two ranks' charts compare
//! by eye.

use plotters::style::RGBColor;

/// Colours of the memory categories.
pub fn category(label: &str) -> Option<RGBColor> {
    Some(match label {
        "pre-existing" | "before the trace" => RGBColor(0x8c, 0x9a, 0xab),
        "parameter" => RGBColor(0x4e, 0x79, 0xa7),
        "gradient" => RGBColor(0x59, 0xa1, 0x4f),
        "optimizer state" => RGBColor(0xb0, 0x7a, 0xa1),
        "activation" => RGBColor(0xf2, 0x8e, 0x2b),
        "temporary" => RGBColor(0xed, 0xc9, 0x48),
        "communication" => RGBColor(0x76, 0xb7, 0xb2),
        "unknown" => RGBColor(0xba, 0xb0, 0xac),
        "other" | super::series::OTHER => RGBColor(0xd9, 0xd9, 0xd9),
        _ => return None,
    })
}

/// Colours for other labels, chosen by a hash of the text.
const PALETTE: [RGBColor; 14] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0x3b, 0x84, 0xc4),
    RGBColor(0x86, 0xbc, 0x86),
    RGBColor(0xd3, 0x72, 0x95),
    RGBColor(0x49, 0x98, 0x94),
    RGBColor(0xc8, 0x93, 0x5e),
];

fn hash(s: &str) -> u64 {
    // FNV-1a: stable across runs and platforms.
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Colour of the peak marker (used by no series).
pub const PEAK: RGBColor = RGBColor(0xd6, 0x00, 0x1c);
/// Colour of out-of-memory markers.
pub const OOM: RGBColor = RGBColor(0x6a, 0x00, 0xa8);
/// Colour of the reserved-memory line.
pub const RESERVED: RGBColor = RGBColor(0x1f, 0x3a, 0x5f);

/// Colours for a chart's groups: categories keep theirs; other labels get a colour from their
/// hash, moving to the next free one if two labels of the same chart collide.
pub fn assign(labels: &[String]) -> Vec<RGBColor> {
    let mut used = vec![false; PALETTE.len()];
    labels
        .iter()
        .map(|l| {
            if let Some(c) = category(l) {
                return c;
            }
            let start = (hash(l) % PALETTE.len() as u64) as usize;
            let slot = (0..PALETTE.len())
                .map(|k| (start + k) % PALETTE.len())
                .find(|&k| !used[k])
                .unwrap_or(start);
            used[slot] = true;
            PALETTE[slot]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_label_same_colour() {
        let a = assign(&["step 4 · F0&B1 mb 4/2".into(), "activation".into()]);
        let b = assign(&["activation".into(), "step 4 · F0&B1 mb 4/2".into()]);
        assert_eq!(a[0], b[1]);
        assert_eq!(a[1], category("activation").unwrap());
        let many: Vec<String> = (0..14).map(|i| format!("label {i}")).collect();
        let colours = assign(&many);
        let distinct: std::collections::HashSet<(u8, u8, u8)> =
            colours.iter().map(|c| (c.0, c.1, c.2)).collect();
        assert_eq!(
            distinct.len(),
            14,
            "no two groups of one chart share a colour"
        );
        assert!(!colours.contains(&PEAK));
    }
}
