//! Assignments a loop or parallel body made to variables it does not own, kept for its parent.
//!
//! Only the last value of each variable matters to the parent (assignments are replayed in
//! order, so a later one overwrites an earlier one), so a name assigned again replaces its
//! earlier entry: the list is bounded by the number of variables, not by iterations.

use crate::model::Value;

/// Assignments, the last value of each name, in the order of those last assignments.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Assignments(Vec<(String, Value)>);

impl Assignments {
    /// Records an assignment.
    pub(crate) fn push(&mut self, name: String, value: Value) {
        if let Some(at) = self.0.iter().position(|(n, _)| *n == name) {
            self.0.remove(at);
        }
        self.0.push((name, value));
    }

    /// Records assignments in order.
    pub(crate) fn extend(&mut self, more: impl IntoIterator<Item = (String, Value)>) {
        for (name, value) in more {
            self.push(name, value);
        }
    }

    /// The assignments, in order.
    pub(crate) fn as_slice(&self) -> &[(String, Value)] {
        &self.0
    }

    /// A copy of the assignments.
    pub(crate) fn to_vec(&self) -> Vec<(String, Value)> {
        self.0.clone()
    }

    /// The assignments, in order.
    pub(crate) fn into_vec(self) -> Vec<(String, Value)> {
        self.0
    }
}

impl From<Vec<(String, Value)>> for Assignments {
    fn from(list: Vec<(String, Value)>) -> Self {
        let mut out = Self::default();
        out.extend(list);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_assignment_replaces_an_earlier_one() {
        let mut a = Assignments::default();
        a.push("x".into(), Value::Int(1));
        a.push("y".into(), Value::Int(2));
        a.push("x".into(), Value::Int(3));
        assert_eq!(
            a.as_slice(),
            [
                ("y".to_owned(), Value::Int(2)),
                ("x".to_owned(), Value::Int(3))
            ]
        );
        for i in 0..1000 {
            a.push("y".into(), Value::Int(i));
        }
        assert_eq!(a.as_slice().len(), 2);
    }
}
