//! Routes: which outgoing edges a completed node activates.

use std::collections::BTreeSet;

/// Which outgoing edges a completed node activates.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Route {
    /// Every outgoing edge is active (the normal case).
    #[default]
    All,
    /// Only unlabelled edges and edges whose label is in the set are active.
    Branches(BTreeSet<String>),
}

impl Route {
    /// A [`Route::Branches`] from a list of labels.
    pub fn branches<I, S>(labels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Route::Branches(labels.into_iter().map(Into::into).collect())
    }

    /// Whether an edge with the given label is active under this route.
    pub fn activates(&self, branch: Option<&str>) -> bool {
        match (self, branch) {
            (Route::All, _) | (_, None) => true,
            (Route::Branches(set), Some(label)) => set.contains(label),
        }
    }
}
