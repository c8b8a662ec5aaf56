//! The control channel between the caller's `Sandbox` and the helper / the sandbox's init:
//! a Unix stream socket carrying length-prefixed JSON frames, with descriptors attached to a
//! frame by `SCM_RIGHTS`.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::RemoteError;
use crate::report::{ExecRefusal, StartReport};
use crate::spec::{ListenerKind, SandboxSpec, User};

/// Version of this protocol; the helper refuses a caller of another version.
pub(crate) const VERSION: u32 = 2;

/// Largest frame accepted.
const MAX_FRAME: usize = 64 << 20;
/// Most descriptors attached to one frame.
const MAX_FDS: usize = 64;

/// Caller → helper/init.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    /// First frame, to the helper.
    Start {
        version: u32,
        spec: Box<SandboxSpec>,
    },
    /// Run a command; stdin, stdout and stderr are attached.
    Run(WireCommand),
    /// Kill everything and exit.
    Stop,
    /// Kill every process but the init, and wait until they are gone; the sandbox stays
    /// (for its teardown with `Stop`, later). Answered with `Emptied`, after the refused
    /// execs still pending.
    Empty,
}

/// A command without its descriptors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireCommand {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub user: User,
    pub cwd: PathBuf,
    /// The caller's stdio that is a terminal is replaced by a terminal of the sandbox's own
    /// (never handed in); its descriptors are not attached.
    pub terminal: Option<WireTerminal>,
    /// capgate's own command (see `RunCommand::capgate_own`).
    pub own: bool,
}

/// A pseudo-terminal the init opens in the sandbox's own `devpts` for a command, in place
/// of the caller's terminal; the caller relays between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireTerminal {
    /// Which of stdin, stdout and stderr are the terminal.
    pub stdio: [bool; 3],
    /// It is the command's controlling terminal (the interactive command's); otherwise
    /// only its output goes there.
    pub controlling: bool,
    /// The caller's window size, set before the command starts.
    pub rows: u16,
    pub cols: u16,
}

/// Helper/init → caller.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    /// The sandbox is up; the listeners are attached, in the spec's order.
    Ready(StartReport),
    /// Start failed.
    Failed(RemoteError),
    /// The command ran and exited with this raw wait status.
    Exited { status: i32 },
    /// The command could not be started.
    NotStarted { program: String, message: String },
    /// A command executed (or tried to) a program the exec allowlist does not grant; sent
    /// as it happens, before the command's `Exited`.
    ExecRefused(ExecRefusal),
    /// The command's terminal: the pty's controlling side is attached. Sent once the
    /// command has exec'd, before its `Exited`.
    Terminal,
    /// The answer to `Empty`: no process but the init is left (`false`: some could not be
    /// killed or did not end in time).
    Emptied { complete: bool },
}

/// Caller → init on the dialer channel: make a socket inside the network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Dial {
    /// IPv6 (`AF_INET6`) rather than IPv4.
    pub v6: bool,
    /// Stream (TCP) or datagram (UDP).
    pub kind: ListenerKind,
}

/// Init → caller on the dialer channel: the socket is attached, or `socket(2)` failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Dialed {
    Made,
    Failed { errno: i32 },
}

/// Sends one frame with descriptors.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    let header = len.to_le_bytes();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one frame"));
    }
    let total = header.len() + body.len();
    let mut sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(&header), IoSlice::new(&body)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    // A stream socket may take a large frame in pieces; the descriptors went with the first.
    while sent < total {
        let rest: Vec<u8> = header
            .iter()
            .chain(body.iter())
            .skip(sent)
            .copied()
            .collect();
        sent += rustix::net::send(sock, &rest, SendFlags::NOSIGNAL)?;
    }
    Ok(())
}

/// Receives one frame and its descriptors; `None` at end of stream.
pub fn recv<T: DeserializeOwned>(sock: BorrowedFd<'_>) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut header = [0u8; 4];
    let mut got = 0;
    let mut fds: Vec<OwnedFd> = Vec::new();
    while got < header.len() {
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = loop {
            match rustix::net::recvmsg(
                sock,
                &mut [IoSliceMut::new(&mut header[got..])],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other?,
            }
        };
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if msg.bytes == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "truncated frame header",
                ))
            };
        }
        got += msg.bytes;
    }
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::other(format!(
            "frame of {len} bytes is too large"
        )));
    }
    let mut body = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        let n = match rustix::io::read(sock, &mut body[filled..]) {
            Err(rustix::io::Errno::INTR) => continue,
            other => other?,
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated frame",
            ));
        }
        filled += n;
    }
    let msg = serde_json::from_slice(&body).map_err(io::Error::other)?;
    Ok(Some((msg, fds)))
}

/// A connected pair of close-on-exec stream sockets.
pub(crate) fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Borrows several owned descriptors.
pub(crate) fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(AsFd::as_fd).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn frames_carry_json_and_descriptors() {
        let (a, b) = pair().unwrap();
        let (mut r, mut w) = std::io::pipe().unwrap();
        let w_fd: OwnedFd = w.try_clone().unwrap().into();
        send(
            a.as_fd(),
            &Reply::Exited { status: 7 << 8 },
            &[w_fd.as_fd()],
        )
        .unwrap();
        drop(w_fd);
        let (msg, fds): (Reply, _) = recv(b.as_fd()).unwrap().unwrap();
        assert!(matches!(msg, Reply::Exited { status } if status == 7 << 8));
        assert_eq!(fds.len(), 1);
        let mut passed = std::fs::File::from(fds.into_iter().next().unwrap());
        passed.write_all(b"hi").unwrap();
        drop(passed);
        w.flush().unwrap();
        drop(w);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hi");
    }

    #[test]
    fn large_frames_and_end_of_stream() {
        let (a, b) = pair().unwrap();
        let big = "x".repeat(3 << 20);
        let writer = std::thread::spawn(move || {
            send(
                a.as_fd(),
                &Reply::NotStarted {
                    program: big,
                    message: String::new(),
                },
                &[],
            )
            .unwrap();
        });
        let (msg, fds): (Reply, _) = recv(b.as_fd()).unwrap().unwrap();
        writer.join().unwrap();
        assert!(matches!(msg, Reply::NotStarted { program, .. } if program.len() == 3 << 20));
        assert!(fds.is_empty());
        assert!(recv::<Reply>(b.as_fd()).unwrap().is_none());
    }
}
