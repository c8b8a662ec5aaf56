//! SIGINT, SIGTERM and SIGHUP during `capgate run` (and SIGWINCH, passed on to the command's
//! terminal).
//!
//! A Ctrl-C, a closed terminal or a service manager must end the run the way any other end
//! does: the sandbox stopped, copy-back finished, the audit log flushed, an ephemeral
//! sandbox's state removed. The signals are caught from the run's first step (by then the
//! default action would leave that state behind); the first one stops the sandbox as soon
//! as it exists, and the run exits with 128 + the signal's number after its cleanup.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context as _, Result};
use capgate_sandbox::{Stopper, WindowWatch};
use rustix::process::Signal;

/// Where the run is, as far as a signal is concerned.
#[derive(Debug)]
enum Stage {
    /// Before the sandbox runs: a signal is kept and stops it when it starts.
    Starting,
    /// The sandbox runs: a signal stops it.
    Running(Stopper),
    /// The sandbox has stopped (its helper is reaped: its pid may be reused); what is
    /// left (copy-back, the audit log) finishes.
    Finishing,
}

#[derive(Debug)]
pub struct Interrupt {
    /// The first signal's number, 0 before one came.
    signal: AtomicI32,
    stage: Mutex<Stage>,
    /// Told of `SIGWINCH`, so that a command's terminal takes the window's new size.
    window: Mutex<Option<WindowWatch>>,
}

impl Interrupt {
    /// Catches the three signals from now on, on a thread of its own that lives as long
    /// as the process (it outlives the gateway's runtime, which stops before copy-back).
    pub fn catch() -> Result<Arc<Interrupt>> {
        let interrupt = Arc::new(Interrupt {
            signal: AtomicI32::new(0),
            stage: Mutex::new(Stage::Starting),
            window: Mutex::new(None),
        });
        let (ready, registered) = std::sync::mpsc::channel();
        let shared = Arc::clone(&interrupt);
        std::thread::Builder::new()
            .name("capgate-signals".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    use tokio::signal::unix::{SignalKind, signal};
                    let streams = (
                        signal(SignalKind::interrupt()),
                        signal(SignalKind::terminate()),
                        signal(SignalKind::hangup()),
                        signal(SignalKind::window_change()),
                    );
                    let (mut int, mut term, mut hup, mut winch) = match streams {
                        (Ok(a), Ok(b), Ok(c), Ok(d)) => (a, b, c, d),
                        (Err(e), _, _, _)
                        | (_, Err(e), _, _)
                        | (_, _, Err(e), _)
                        | (_, _, _, Err(e)) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(()));
                    loop {
                        let (name, number) = tokio::select! {
                            _ = int.recv() => ("SIGINT", Signal::INT),
                            _ = term.recv() => ("SIGTERM", Signal::TERM),
                            _ = hup.recv() => ("SIGHUP", Signal::HUP),
                            _ = winch.recv() => {
                                shared.window_changed();
                                continue;
                            }
                        };
                        shared.received(name, number.as_raw());
                    }
                });
            })
            .context("cannot start the signal thread")?;
        registered
            .recv()
            .context("the signal thread ended before it caught anything")?
            .context("cannot catch SIGINT, SIGTERM and SIGHUP")?;
        Ok(interrupt)
    }

    /// The first signal stops the sandbox (or the start, or lets the finish go on) and is
    /// said once; later ones change nothing.
    fn received(&self, name: &str, number: i32) {
        if self
            .signal
            .compare_exchange(0, number, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        let stage = self.stage.lock().unwrap_or_else(PoisonError::into_inner);
        // Stopped first, said after: writing to stderr may block (a full pipe).
        let said = match &*stage {
            Stage::Starting => "stopping the run",
            Stage::Running(stopper) => {
                stopper.stop();
                "stopping the sandbox"
            }
            Stage::Finishing => "the sandbox has stopped; finishing the run first",
        };
        drop(stage);
        say!("capgate: {name}: {said}");
    }

    /// The sandbox runs: `stopper` ends it on a signal, at once if one already came.
    pub fn arm(&self, stopper: Stopper) {
        let mut stage = self.stage.lock().unwrap_or_else(PoisonError::into_inner);
        if self.signalled().is_some() {
            stopper.stop();
        }
        *stage = Stage::Running(stopper);
    }

    /// From now on a change of the window's size is passed on to `watch`.
    pub fn watch_window(&self, watch: WindowWatch) {
        *self.window.lock().unwrap_or_else(PoisonError::into_inner) = Some(watch);
    }

    fn window_changed(&self) {
        if let Some(watch) = &*self.window.lock().unwrap_or_else(PoisonError::into_inner) {
            watch.window_changed();
        }
    }

    /// The sandbox is about to be reaped: no signal may use its helper's pid any more.
    pub fn disarm(&self) {
        *self.stage.lock().unwrap_or_else(PoisonError::into_inner) = Stage::Finishing;
    }

    /// The exit code a signal gives the run (128 + its number), if one came.
    pub fn signalled(&self) -> Option<u8> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            n => u8::try_from(128 + n).ok(),
        }
    }
}
