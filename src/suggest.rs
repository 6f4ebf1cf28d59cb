//! "Did you mean ...?": how far a mistyped name is from the one meant, for the errors and
//! warnings about variables (`MAX_TOKEN`) and log levels (`RUST_LOG=warning`). A leaf, so
//! configuration and telemetry can both use it without depending on each other.

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
/// neighbours cost one each (`MAX_TOKEN`, `MAX_TOKNES` and `MAX_TOKENS` are one apart).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // d[i][j]: the distance between the first i characters of a and the first j of b.
    let mut d: Vec<Vec<usize>> = (0..=a.len()).map(|i| vec![i; b.len() + 1]).collect();
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let substitution = d[i - 1][j - 1] + usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = substitution.min(d[i - 1][j] + 1).min(d[i][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// The candidate nearest `name`, if it is at most `most` edits away (the first in order among
/// the nearest): what "did you mean ...?" names.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    most: usize,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|(distance, _)| *distance <= most)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::{closest, edit_distance};

    #[test]
    fn the_closest_candidate_within_reach_is_named() {
        assert_eq!(closest("generl", ["auth", "general"], 2), Some("general"));
        assert_eq!(closest("minut", ["second", "minute", "hour"], 2), Some("minute"));
        assert_eq!(closest("weekly", ["second", "minute"], 2), None);
    }

    #[test]
    fn edit_distance_counts_swaps_as_one() {
        assert_eq!(edit_distance("MAX_TOKENS", "MAX_TOKENS"), 0);
        assert_eq!(edit_distance("MAX_TOKEN", "MAX_TOKENS"), 1);
        assert_eq!(edit_distance("MAX_TOKNES", "MAX_TOKENS"), 1);
        assert_eq!(edit_distance("MAX_TOKES", "MAX_TOKENS"), 1);
        assert_eq!(edit_distance("MAXTOKEN", "MAX_TOKENS"), 2);
        assert_eq!(edit_distance("HOST", "PORT"), 2);
        assert_eq!(edit_distance("", "PORT"), 4);
        assert_eq!(edit_distance("PATH", ""), 4);
    }
}
