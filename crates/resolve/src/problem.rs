//! Why a composition is refused.

use std::fmt;

use capgate_spec::text::printable;

use serde::Serialize;

/// One reason a composition is refused, attributed to a kit and a path in it when it has
/// one. Every refusal of a composition is collected and reported together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The kit reference the problem is in, when it is in one kit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kit: Option<String>,
    /// The path in that kit, e.g. `capabilities[2]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub message: String,
}

impl Refusal {
    pub fn new(message: impl Into<String>) -> Self {
        Refusal {
            kit: None,
            path: None,
            message: message.into(),
        }
    }

    pub fn in_kit(kit: &str, message: impl Into<String>) -> Self {
        Refusal {
            kit: Some(kit.to_owned()),
            path: None,
            message: message.into(),
        }
    }

    pub fn at(kit: &str, path: &str, message: impl Into<String>) -> Self {
        Refusal {
            kit: Some(kit.to_owned()),
            path: Some(path.to_owned()),
            message: message.into(),
        }
    }
}

/// `kit path: message`, leaving out what is unknown.
/// Kit values in it are spelled out ([`printable`]): a refusal is printed on terminals.
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = printable(&self.message);
        match (&self.kit, &self.path) {
            (Some(k), Some(p)) => write!(f, "{} {}: {message}", printable(k), printable(p)),
            (Some(k), None) => write!(f, "{}: {message}", printable(k)),
            (None, Some(p)) => write!(f, "{}: {message}", printable(p)),
            (None, None) => f.write_str(&message),
        }
    }
}
