//! The idle limit on bodies: a body whose bytes stop moving for the idle timeout ends its
//! exchange, so a client (or upstream) that trickles or stalls a body cannot hold a
//! connection, an upstream and a connection slot forever (slowloris on bodies).

use std::future::Future;
use std::io;
use std::time::Duration;

/// Which side of a relay stopped moving for the idle timeout. Carried inside an
/// [`io::Error`] of kind `TimedOut`; [`Stall::of`] finds it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Stall {
    /// The sending side sent nothing.
    #[error("no byte of the body arrived in time")]
    Source,
    /// The receiving side read nothing.
    #[error("the receiver took no byte of the body in time")]
    Sink,
}

impl Stall {
    /// The stall an I/O error stands for, if it is one.
    pub(crate) fn of(e: &io::Error) -> Option<Stall> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<Stall>())
            .copied()
    }

    fn error(self) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, self)
    }
}

/// `op` (a read from the sending side), failing with [`Stall::Source`] after `idle`.
pub(crate) async fn reading<T>(
    idle: Duration,
    op: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout(idle, op)
        .await
        .unwrap_or_else(|_| Err(Stall::Source.error()))
}

/// `op` (a write to the receiving side), failing with [`Stall::Sink`] after `idle`.
pub(crate) async fn writing<T>(
    idle: Duration,
    op: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout(idle, op)
        .await
        .unwrap_or_else(|_| Err(Stall::Sink.error()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[tokio::test]
    async fn a_stalled_read_or_write_says_which_side_stalled() {
        let idle = Duration::from_millis(20);
        let e = reading(idle, std::future::pending::<io::Result<()>>())
            .await
            .unwrap_err();
        assert_eq!(
            (e.kind(), Stall::of(&e)),
            (io::ErrorKind::TimedOut, Some(Stall::Source))
        );
        let e = writing(idle, std::future::pending::<io::Result<()>>())
            .await
            .unwrap_err();
        assert_eq!(Stall::of(&e), Some(Stall::Sink));
        // An operation that finishes in time, and any other error, are passed through.
        assert_eq!(reading(idle, async { Ok(7) }).await.unwrap(), 7);
        let other = writing(idle, async { Err::<(), _>(io::Error::other("x")) })
            .await
            .unwrap_err();
        assert_eq!(Stall::of(&other), None);
    }
}
