//! Moving a body between two plain TCP sockets through a pipe with splice(2), so its bytes
//! never cross into user space.
//!
//! The pipe is filled only when empty and drained completely before the next fill. That
//! makes every `EAGAIN` unambiguous: while filling, the empty pipe cannot be full, so the
//! source socket has nothing to read; while draining, the pipe has bytes, so the
//! destination socket is full. tokio's readiness is then cleared for the right socket.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::stall;

/// How much the pipe holds (and so how much one splice moves); the kernel may round it or
/// refuse the size (a user past `pipe-user-pages-soft` gets one-page pipes), which only
/// makes the steps smaller.
///
/// 64 KiB, the kernel's default, as HAProxy's pipes. Measured on the 1 MB benchmark
/// (bench/, alternating runs): 1 MiB pipes cost the gateway about 330 µs of CPU per
/// response and gave 64–71 % of direct; 64 KiB about 260 µs and 71–74 %; 128 and 256 KiB
/// in between; 32 KiB worse than all (twice the splices). A large fill makes a large
/// burst into the client's socket, most of which the kernel queues and pushes again.
const PIPE_SIZE: usize = 64 * 1024;

/// A pipe for moving bodies, kept by a connection so that one is made per connection, not
/// per body. It is empty between bodies; after a failed move it may hold bytes and must be
/// dropped with the connection it served.
#[derive(Debug)]
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// What one fill may move: the pipe's size as the kernel granted it.
    step: usize,
}

/// Writes all of `bytes` to `dst` with `flags` (`MSG_MORE`: TCP holds them back to leave
/// with what is sent next, and the caller must send more right after, or they wait for the
/// kernel's 200 ms cork timer).
async fn send_all(
    dst: &TcpStream,
    mut bytes: &[u8],
    flags: rustix::net::SendFlags,
    idle: Duration,
) -> io::Result<()> {
    while !bytes.is_empty() {
        stall::writing(idle, dst.writable()).await?;
        match dst.try_io(Interest::WRITABLE, || {
            Ok(rustix::net::send(dst, bytes, flags)?)
        }) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Pipe {
    pub(crate) fn new() -> io::Result<Self> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let step = rustix::pipe::fcntl_setpipe_size(&write, PIPE_SIZE)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))
            .unwrap_or(PIPE_SIZE);
        Ok(Self { read, write, step })
    }

    /// Sends `head` (a response head, and any body bytes read with it), then moves exactly
    /// `len` bytes from `src` to `dst`. Fails with `UnexpectedEof` when `src` ends first,
    /// and with a [`stall::Stall`] when either side makes no progress for `idle`.
    ///
    /// Where the body's first bytes are already at hand, the head leaves in one segment
    /// with them (`MSG_MORE`; the sockets have `TCP_NODELAY`), as nginx sends its own head
    /// and body, instead of alone with a wake-up of the client for it; where they are not,
    /// it leaves at once, never waiting on the body.
    pub(crate) async fn tcp_to_tcp(
        &mut self,
        src: &TcpStream,
        dst: &TcpStream,
        mut head: &[u8],
        len: u64,
        idle: Duration,
    ) -> io::Result<()> {
        let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        let mut left = len;
        if len == 0 {
            return send_all(dst, head, rustix::net::SendFlags::empty(), idle).await;
        }
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(self.step);
            if !head.is_empty() {
                // One try without waiting (tokio's readiness may not know of the bytes).
                match rustix::pipe::splice(src, None, &self.write, None, want, flags) {
                    Ok(n) if n > 0 => {
                        send_all(dst, head, rustix::net::SendFlags::MORE, idle).await?;
                        head = &[];
                        left -= n as u64;
                        self.drain(dst, n, idle).await?;
                        continue;
                    }
                    Ok(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "body ended early",
                        ));
                    }
                    Err(rustix::io::Errno::AGAIN) => {
                        send_all(dst, head, rustix::net::SendFlags::empty(), idle).await?;
                        head = &[];
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let filled = loop {
                stall::reading(idle, src.readable()).await?;
                match src.try_io(Interest::READABLE, || {
                    Ok(rustix::pipe::splice(
                        src,
                        None,
                        &self.write,
                        None,
                        want,
                        flags,
                    )?)
                }) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            };
            if filled == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "body ended early",
                ));
            }
            left -= filled as u64;
            self.drain(dst, filled, idle).await?;
        }
        Ok(())
    }

    /// Moves the `in_pipe` bytes the pipe holds into `dst`.
    async fn drain(&self, dst: &TcpStream, mut in_pipe: usize, idle: Duration) -> io::Result<()> {
        let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        while in_pipe > 0 {
            stall::writing(idle, dst.writable()).await?;
            match dst.try_io(Interest::WRITABLE, || {
                Ok(rustix::pipe::splice(
                    &self.read, None, dst, None, in_pipe, flags,
                )?)
            }) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => in_pipe -= n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const IDLE: Duration = Duration::from_secs(30);

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn moves_exactly_len_bytes_and_leaves_the_rest() {
        let (mut up_far, up_near) = pair().await;
        let (down_near, mut down_far) = pair().await;
        let body = pattern(3 * 1024 * 1024 + 17);
        let len = body.len() as u64;
        let writer = tokio::spawn(async move {
            up_far.write_all(&body).await.unwrap();
            up_far.write_all(b"NEXT").await.unwrap();
            up_far
        });
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; len as usize];
            down_far.read_exact(&mut got).await.unwrap();
            got
        });
        let mut pipe = Pipe::new().unwrap();
        pipe.tcp_to_tcp(&up_near, &down_near, &[], len, IDLE)
            .await
            .unwrap();
        let _keep = writer.await.unwrap();
        assert_eq!(reader.await.unwrap(), pattern(3 * 1024 * 1024 + 17));
        // The bytes after the body are still on the source socket, unread.
        let mut next = [0u8; 4];
        let mut up_near = up_near;
        up_near.read_exact(&mut next).await.unwrap();
        assert_eq!(&next, b"NEXT");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_pipe_carries_body_after_body() {
        let (mut up_far, up_near) = pair().await;
        let (down_near, mut down_far) = pair().await;
        let sizes = [1_500_000_usize, 1, 70_000, 2 * 1024 * 1024];
        let stream: Vec<u8> = sizes.iter().flat_map(|&n| pattern(n)).collect();
        let total = stream.len();
        let writer = tokio::spawn(async move {
            up_far.write_all(&stream).await.unwrap();
            up_far
        });
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; total];
            down_far.read_exact(&mut got).await.unwrap();
            got
        });
        let mut pipe = Pipe::new().unwrap();
        for n in sizes {
            pipe.tcp_to_tcp(&up_near, &down_near, &[], n as u64, IDLE)
                .await
                .unwrap();
        }
        let _keep = writer.await.unwrap();
        let expected: Vec<u8> = sizes.iter().flat_map(|&n| pattern(n)).collect();
        assert!(
            reader.await.unwrap() == expected,
            "the bodies arrive in order, whole"
        );
    }

    /// A head whose body's first bytes are at hand leaves with them; the last splice
    /// pushes everything out, so the reader gets head and body, in order, without waiting
    /// on a cork that nothing releases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_head_leaves_with_the_body_at_hand() {
        let (mut up_far, up_near) = pair().await;
        let (down_near, mut down_far) = pair().await;
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n";
        let body = pattern(100_000);
        up_far.write_all(&body).await.unwrap();
        let mut pipe = Pipe::new().unwrap();
        pipe.tcp_to_tcp(&up_near, &down_near, head, body.len() as u64, IDLE)
            .await
            .unwrap();
        let mut got = vec![0u8; head.len() + body.len()];
        tokio::time::timeout(Duration::from_secs(10), down_far.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got[..head.len()], head);
        assert!(got[head.len()..] == body[..], "the body follows the head");
    }

    /// A head whose body has not begun to arrive leaves at once: the client gets it before
    /// the upstream sends a byte of the body (here, only once the head has arrived), as a
    /// slow upstream's client must. Twin of the test above.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_head_never_waits_for_its_body() {
        let (mut up_far, up_near) = pair().await;
        let (down_near, mut down_far) = pair().await;
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n";
        let body = pattern(70_000);
        let relay = tokio::spawn(async move {
            let mut pipe = Pipe::new().unwrap();
            pipe.tcp_to_tcp(&up_near, &down_near, head, 70_000, IDLE)
                .await
                .unwrap();
        });
        let mut got_head = vec![0u8; head.len()];
        tokio::time::timeout(Duration::from_secs(10), down_far.read_exact(&mut got_head))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got_head[..], head);
        up_far.write_all(&body).await.unwrap();
        let mut got = vec![0u8; body.len()];
        down_far.read_exact(&mut got).await.unwrap();
        assert!(got == body, "then the body");
        relay.await.unwrap();
    }

    #[tokio::test]
    async fn a_source_that_ends_early_is_an_error() {
        let (mut up_far, up_near) = pair().await;
        let (down_near, _down_far) = pair().await;
        up_far.write_all(&pattern(1000)).await.unwrap();
        drop(up_far);
        let err = Pipe::new()
            .unwrap()
            .tcp_to_tcp(&up_near, &down_near, &[], 5000, IDLE)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
