//! The caller's side of the commands' terminals.
//!
//! The caller's terminal is never handed into the sandbox: there the workload could chmod
//! it (Landlock does not cover chmod), change its settings for after the run, or keep
//! reading it. Where the caller's stdout or stderr is a terminal, the init opens a
//! pseudo-terminal in the sandbox's own `devpts` for the command instead (so programs still
//! see a terminal: line-buffered output, colours, one stream for both), passes its
//! controlling side out, and the caller copies its output to the caller's terminal.
//!
//! The command the user works with ([`RunCommand::interactive`](crate::RunCommand)), from
//! an interactive caller (stdin a terminal, capgate in its foreground, stdout not a pipe),
//! also gets that pty on its stdin and as its controlling terminal (job control, Ctrl-C
//! and Ctrl-Z act inside the sandbox, not on capgate), and the caller relays its keyboard,
//! as `ssh -t` and `docker run -it` do: its own terminal in raw mode while the command runs
//! (the pty does the line editing, echo and signals), what is typed goes in, and a change
//! of window size ([`WindowWatch::window_changed`], on `SIGWINCH`) is passed on. Every
//! other command reads nothing from the caller's keyboard (stdin `/dev/null`), so that it
//! cannot take keys from whatever else reads the terminal (a pager the output goes to, the
//! shell of a background job), and gets no controlling terminal (whose hang-up would reach
//! the processes a hook leaves behind).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use rustix::termios::{OptionalActions, Termios, tcgetattr, tcgetwinsize, tcsetattr, tcsetwinsize};

/// Which of the caller's stdin, stdout and stderr are a terminal.
pub(crate) fn terminals(stdio: [BorrowedFd<'_>; 3]) -> [bool; 3] {
    stdio.map(rustix::termios::isatty)
}

/// The caller is interactive: stdin is a terminal and capgate is in its foreground (a
/// background job must not read it), and stdout is not a pipe or socket (a pipeline into
/// a pager, which reads the same keyboard).
pub(crate) fn interactive(stdio: [BorrowedFd<'_>; 3], is: [bool; 3]) -> bool {
    let foreground = || {
        rustix::termios::tcgetpgrp(stdio[0]).is_ok_and(|group| group == rustix::process::getpgrp())
    };
    let piped = || {
        rustix::fs::fstat(stdio[1]).is_ok_and(|st| {
            let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
            kind == rustix::fs::FileType::Fifo || kind == rustix::fs::FileType::Socket
        })
    };
    is[0] && foreground() && !piped()
}

/// The size of the caller's window, from the first of `stdio` that is a terminal: rows
/// and columns (24 × 80 for a terminal that cannot tell).
pub(crate) fn window_size(stdio: [BorrowedFd<'_>; 3], is: [bool; 3]) -> (u16, u16) {
    let size = [1, 2, 0]
        .into_iter()
        .find(|&i| is[i])
        .and_then(|i| tcgetwinsize(stdio[i]).ok())
        .filter(|s| s.ws_row > 0 && s.ws_col > 0);
    (size.map_or(24, |s| s.ws_row), size.map_or(80, |s| s.ws_col))
}

/// Whether the caller's terminal is in raw mode now (a command's terminal is relayed): a
/// line written to it then needs its own carriage return. One per process, as the
/// process's terminal is.
static RAW: AtomicBool = AtomicBool::new(false);

/// Whether capgate's terminal is in raw mode now, for a command's terminal: capgate's own
/// messages must then end their lines with `\r\n`.
pub fn caller_terminal_is_raw() -> bool {
    RAW.load(Ordering::SeqCst)
}

/// Tells the relay that the caller's window changed size (from a `SIGWINCH` handler's
/// thread); the command's terminal takes the new size, and its foreground gets `SIGWINCH`.
#[derive(Debug, Clone)]
pub struct WindowWatch(Arc<OwnedFd>);

impl WindowWatch {
    /// Passes the caller's window size on to the command's terminal, if one is relayed.
    pub fn window_changed(&self) {
        // A full pipe already holds a wake-up: the size is read when it is handled.
        let _ = rustix::io::write(&*self.0, &[WAKE_RESIZE]);
    }
}

/// The byte that wakes the input thread (to read the window's size, or to find the quit
/// flag set).
const WAKE_RESIZE: u8 = b'r';

/// The most typed bytes kept while the command's terminal has no room for them.
const MAX_PENDING: usize = 64 * 1024;

/// A command's output copier: its thread, and word when it is done.
#[derive(Debug)]
pub(crate) struct Copier {
    thread: JoinHandle<()>,
    done: Receiver<()>,
    master: Arc<OwnedFd>,
}

impl Copier {
    /// Copies what a command writes to its terminal (`master`, the pty's controlling side)
    /// to the caller's `output` until the pty says that nothing holds its terminal any
    /// more (EIO, once what was written is read). Output the caller's terminal will not
    /// take (it is gone) is read and dropped: the command never blocks on a terminal that
    /// nobody drains.
    pub(crate) fn start(master: Arc<OwnedFd>, output: OwnedFd) -> io::Result<Copier> {
        let (tx, done) = std::sync::mpsc::channel();
        let copied = Arc::clone(&master);
        let thread = std::thread::Builder::new()
            .name("capgate-terminal-out".into())
            .spawn(move || {
                let master = copied;
                let mut buf = vec![0u8; 16 * 1024];
                let mut shown = true;
                loop {
                    match rustix::io::read(&*master, &mut buf) {
                        Ok(0) => break,
                        Ok(n) => shown = shown && write_all(output.as_fd(), &buf[..n]).is_ok(),
                        Err(rustix::io::Errno::INTR) => {}
                        // The keyboard's relay makes an interactive command's pty
                        // non-blocking.
                        Err(rustix::io::Errno::AGAIN) => {
                            if !wait_for(master.as_fd(), rustix::event::PollFlags::IN) {
                                break;
                            }
                        }
                        Err(_) => break,
                    }
                }
                let _ = tx.send(());
            })?;
        Ok(Copier {
            thread,
            done,
            master,
        })
    }

    /// Waits until the copier is done: all of it once nothing inside holds the terminal
    /// any more (however slowly the caller's terminal takes it), so that it comes before
    /// what is said next; until `deadline` only while a process left inside holds it.
    pub(crate) fn wait_until(&self, deadline: Instant) {
        use rustix::event::{PollFd, PollFlags, poll};
        let left = deadline.saturating_duration_since(Instant::now());
        if !matches!(
            self.done.recv_timeout(left),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        ) {
            return;
        }
        // The pty's controlling side hangs up once every holder of its terminal has closed
        // it: what is left to copy is bounded, and is waited for.
        let mut fds = [PollFd::new(&*self.master, PollFlags::empty())];
        let zero = rustix::event::Timespec::default();
        if poll(&mut fds, Some(&zero)).is_ok() && fds[0].revents().contains(PollFlags::HUP) {
            let _ = self.done.recv();
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Once nothing holds the terminal any more (the sandbox has stopped).
    pub(crate) fn join(self) {
        let _ = self.thread.join();
    }
}

/// The relay of the caller's keyboard to the interactive command's terminal, for the
/// sandbox's life: one thread reads the keyboard and writes to the attached terminal.
#[derive(Debug)]
pub(crate) struct TerminalRelay {
    /// The caller's terminal that is read (its stdin).
    keyboard: OwnedFd,
    /// Its settings before the running command's raw mode.
    saved: Mutex<Option<Termios>>,
    /// The controlling side the input goes to (the running command's).
    current: Arc<Mutex<Option<Arc<OwnedFd>>>>,
    input: Option<JoinHandle<()>>,
    wake: Arc<OwnedFd>,
    /// Set before the last wake-up: the input thread ends (a full wake pipe loses no quit).
    quit: Arc<AtomicBool>,
}

impl TerminalRelay {
    /// Starts relaying the caller's `keyboard` (stdin); the window's size is read from
    /// `sized_by`. `wake` is the read end of `watch`'s pipe.
    pub(crate) fn start(
        keyboard: BorrowedFd<'_>,
        sized_by: BorrowedFd<'_>,
        wake: OwnedFd,
        watch: &WindowWatch,
    ) -> io::Result<TerminalRelay> {
        let keyboard = keyboard.try_clone_to_owned()?;
        let current: Arc<Mutex<Option<Arc<OwnedFd>>>> = Arc::default();
        let quit = Arc::new(AtomicBool::new(false));
        let input = {
            let (keys, sized_by) = (keyboard.try_clone()?, sized_by.try_clone_to_owned()?);
            let (current, quit) = (Arc::clone(&current), Arc::clone(&quit));
            let wake = Wake { pipe: wake, quit };
            std::thread::Builder::new()
                .name("capgate-terminal-in".into())
                .spawn(move || relay_input(&keys, &wake, &current, &sized_by))?
        };
        Ok(TerminalRelay {
            keyboard,
            saved: Mutex::new(None),
            current,
            input: Some(input),
            wake: Arc::clone(&watch.0),
            quit,
        })
    }

    /// While the command runs, the caller's terminal passes every key on as it is typed
    /// (raw mode): the command's terminal does the line editing, echo and signals. The
    /// settings are taken anew each time, and [`TerminalRelay::cooked`] puts them back.
    pub(crate) fn raw(&self) -> io::Result<RawMode<'_>> {
        let saved = tcgetattr(&self.keyboard)?;
        let mut raw = saved.clone();
        raw.make_raw();
        tcsetattr(&self.keyboard, OptionalActions::Drain, &raw)?;
        *self.saved.lock().unwrap_or_else(PoisonError::into_inner) = Some(saved);
        RAW.store(true, Ordering::SeqCst);
        Ok(RawMode(self))
    }

    /// Between commands and after the last, the caller's terminal is as it was: capgate's
    /// own messages read as usual, and Ctrl-C reaches capgate.
    pub(crate) fn cooked(&self) {
        let saved = self
            .saved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(saved) = saved {
            let _ = tcsetattr(&self.keyboard, OptionalActions::Drain, &saved);
            RAW.store(false, Ordering::SeqCst);
        }
    }

    /// The interactive command's terminal (its controlling side): what is typed goes to it
    /// from now on, until [`TerminalRelay::detach`]. It is made non-blocking: the input
    /// thread never waits on a terminal whose command has stopped reading.
    pub(crate) fn attach(&self, master: Arc<OwnedFd>) -> io::Result<()> {
        let flags = rustix::fs::fcntl_getfl(&*master)?;
        rustix::fs::fcntl_setfl(&*master, flags | rustix::fs::OFlags::NONBLOCK)?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(master);
        // The input thread watches the keyboard now, and the window may have changed since
        // the command's terminal was sized.
        let _ = rustix::io::write(&*self.wake, &[WAKE_RESIZE]);
        Ok(())
    }

    /// The command has ended: keys typed from now on stay in the caller's terminal, and
    /// those not yet written to its terminal are dropped.
    pub(crate) fn detach(&self) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let _ = rustix::io::write(&*self.wake, &[WAKE_RESIZE]);
    }
}

/// The caller's terminal in raw mode for a command: cooked again when dropped, on every
/// path out of the run.
#[derive(Debug)]
pub(crate) struct RawMode<'a>(&'a TerminalRelay);

impl Drop for RawMode<'_> {
    fn drop(&mut self) {
        self.0.cooked();
    }
}

/// The input thread's wake-ups: a pipe, and the flag that says the last one is to quit.
struct Wake {
    pipe: OwnedFd,
    quit: Arc<AtomicBool>,
}

/// Dropped: the input thread ended, the caller's terminal as it was.
impl Drop for TerminalRelay {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        let _ = rustix::io::write(&*self.wake, &[WAKE_RESIZE]);
        if let Some(input) = self.input.take() {
            let _ = input.join();
        }
        self.cooked();
    }
}

/// Waits until `fd` is ready for `flags`; `false` if polling fails.
fn wait_for(fd: BorrowedFd<'_>, flags: rustix::event::PollFlags) -> bool {
    let mut fds = [rustix::event::PollFd::new(&fd, flags)];
    matches!(
        rustix::event::poll(&mut fds, None),
        Ok(_) | Err(rustix::io::Errno::INTR)
    )
}

/// Copies what is typed to the attached command's terminal, and applies window changes,
/// until told to quit. Nothing waits on the command's terminal: keys it has no room for
/// yet are kept (up to [`MAX_PENDING`]) and written as it makes room, and dropped when it
/// is detached.
fn relay_input(
    keyboard: &OwnedFd,
    wake: &Wake,
    current: &Mutex<Option<Arc<OwnedFd>>>,
    sized_by: &OwnedFd,
) {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut keyboard_open = true;
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_for: Option<Arc<OwnedFd>> = None;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let attached = current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // Keys read for a terminal that is no longer attached are not for the next one.
        let same = match (&attached, &pending_for) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if !same {
            pending.clear();
            pending_for.clone_from(&attached);
        }
        // While a command's terminal is attached the keyboard is read even when the keys
        // cannot be kept (they are dropped, as a terminal drops what overflows its input):
        // the rest of a long paste must not be left for the caller's shell to run.
        let read_keys = keyboard_open && attached.is_some();
        let waiting = attached.as_ref().filter(|_| !pending.is_empty());
        let (wake_ready, keys_ready, room) = {
            let mut fds = vec![PollFd::new(&wake.pipe, PollFlags::IN)];
            if read_keys {
                fds.push(PollFd::new(keyboard, PollFlags::IN));
            }
            if let Some(master) = waiting {
                fds.push(PollFd::new(&**master, PollFlags::OUT));
            }
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
            let ready = |i: usize| fds.get(i).is_some_and(|f| !f.revents().is_empty());
            let room_at = 1 + usize::from(read_keys);
            (
                ready(0),
                read_keys && ready(1),
                waiting.is_some() && ready(room_at),
            )
        };
        if wake_ready {
            let mut got = [0u8; 64];
            let n = match rustix::io::read(&wake.pipe, &mut got) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                Err(_) => 0,
            };
            // Every `WindowWatch` dropped, or told to quit.
            if n == 0 || wake.quit.load(Ordering::SeqCst) {
                return;
            }
            if let (Some(master), Ok(size)) = (&attached, tcgetwinsize(sized_by)) {
                let _ = tcsetwinsize(&**master, size);
            }
        }
        if keys_ready {
            match rustix::io::read(keyboard, &mut buf) {
                Ok(n) if n > 0 => {
                    let room = MAX_PENDING.saturating_sub(pending.len()).min(n);
                    pending.extend_from_slice(&buf[..room]);
                }
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                // The caller's terminal hung up: nothing more will be typed.
                _ => keyboard_open = false,
            }
        }
        if (room || keys_ready)
            && !pending.is_empty()
            && let Some(master) = &attached
        {
            match rustix::io::write(&**master, &pending) {
                Ok(n) => {
                    pending.drain(..n);
                }
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                // Its command is gone (EIO): what was typed for it is dropped.
                Err(_) => pending.clear(),
            }
        }
    }
}

/// Writes all of `bytes`, waiting for room when `fd` is non-blocking (a terminal shares
/// that flag with every process that has it open, so the caller's may be).
pub(crate) fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    use rustix::event::{PollFd, PollFlags, poll};
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
                match poll(&mut fds, None) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The pipe behind a [`WindowWatch`]: its read end for the relay. Non-blocking, so that a
/// signal handler's thread never waits on it.
pub(crate) fn window_pipe() -> io::Result<(OwnedFd, WindowWatch)> {
    use rustix::pipe::{PipeFlags, pipe_with};
    let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    Ok((read, WindowWatch(Arc::new(write))))
}
