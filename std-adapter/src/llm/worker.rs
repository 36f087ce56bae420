//! The background worker of a session's LLM work: one thread that answers summary and
//! extraction jobs with an [`LlmClient`], in the order they were sent, over channels (no
//! async runtime). The session sends jobs and collects outcomes; it never blocks on the model.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{LlmClient, LlmError, LlmSummary};
use crate::message::ChatMessage;

/// Fold `messages` into `previous` for the session summary `summary_id`.
#[derive(Clone, Debug)]
pub(crate) struct SummaryJob {
    pub summary_id: u64,
    /// The core summary's fingerprint when the job was made: the answer replaces it only if
    /// it is still the same.
    pub fingerprint: u64,
    /// Restore generation the job belongs to (answers from before a restore are stale).
    pub generation: u64,
    pub previous: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Source ranges the answer stands for.
    pub covers: Vec<(u64, u64)>,
    pub max_tokens: u32,
}

/// Read the declared `keys` from the user message `message_id`.
#[derive(Clone, Debug)]
pub(crate) struct ExtractJob {
    pub message_id: u64,
    pub generation: u64,
    pub keys: Vec<String>,
    /// Entity values when the job was made.
    pub snapshot: BTreeMap<String, String>,
    pub text: String,
}

#[derive(Clone, Debug)]
pub(crate) enum Job {
    Summary(SummaryJob),
    Extract(ExtractJob),
}

/// What the model answered to a job, with the job (less its input) and the call's duration.
#[derive(Debug)]
pub(crate) enum Outcome {
    Summary {
        job: SummaryJob,
        result: Result<LlmSummary, LlmError>,
        elapsed: Duration,
    },
    Extract {
        job: ExtractJob,
        result: Result<BTreeMap<String, String>, LlmError>,
        elapsed: Duration,
    },
}

/// What waiting for the next outcome gave.
#[derive(Debug)]
pub(crate) enum Next {
    Ready(Box<Outcome>),
    /// Nothing arrived in time (or nothing is pending).
    Idle,
    /// The worker thread is gone; its pending jobs will never be answered.
    Gone,
}

/// The worker thread and its two channels.
#[derive(Debug)]
pub(crate) struct Worker {
    jobs: Sender<Job>,
    outcomes: Receiver<Outcome>,
    pending: usize,
    _thread: JoinHandle<()>,
}

impl Worker {
    /// Starts the thread. It ends by itself when the session (the job sender) is dropped,
    /// after the job it is running; nothing joins it, so dropping a session never waits for
    /// the model.
    pub(crate) fn spawn(client: LlmClient) -> std::io::Result<Self> {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (outbox, outcomes) = mpsc::channel::<Outcome>();
        let thread = std::thread::Builder::new().name("ctxwin-llm".into()).spawn(move || {
            for job in inbox {
                if outbox.send(answer(&client, job)).is_err() {
                    break;
                }
            }
        })?;
        Ok(Self { jobs, outcomes, pending: 0, _thread: thread })
    }

    /// Queues `job`; gives it back when the worker is gone.
    pub(crate) fn send(&mut self, job: Job) -> Result<(), Job> {
        match self.jobs.send(job) {
            Ok(()) => {
                self.pending += 1;
                Ok(())
            }
            Err(mpsc::SendError(job)) => Err(job),
        }
    }

    /// Jobs sent whose outcome has not been collected.
    pub(crate) fn pending(&self) -> usize {
        self.pending
    }

    /// The next outcome, waiting at most `timeout` (not at all for `Duration::ZERO`).
    pub(crate) fn next(&mut self, timeout: Duration) -> Next {
        if self.pending == 0 {
            return Next::Idle;
        }
        let received = if timeout.is_zero() {
            self.outcomes.try_recv().map_err(|error| match error {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            })
        } else {
            self.outcomes.recv_timeout(timeout)
        };
        match received {
            Ok(outcome) => {
                self.pending -= 1;
                Next::Ready(Box::new(outcome))
            }
            Err(RecvTimeoutError::Timeout) => Next::Idle,
            Err(RecvTimeoutError::Disconnected) => {
                self.pending = 0;
                Next::Gone
            }
        }
    }
}

/// Runs one job against the server.
fn answer(client: &LlmClient, job: Job) -> Outcome {
    let started = Instant::now();
    match job {
        Job::Summary(mut job) => {
            let result = client.summarize(job.previous.as_deref(), &job.messages, job.max_tokens);
            // The input is not needed any more; the outcome travels light.
            job.messages = Vec::new();
            job.previous = None;
            Outcome::Summary { job, result, elapsed: started.elapsed() }
        }
        Job::Extract(mut job) => {
            let keys: Vec<&str> = job.keys.iter().map(String::as_str).collect();
            let result = client.extract(&keys, &job.snapshot, &job.text);
            job.text = String::new();
            Outcome::Extract { job, result, elapsed: started.elapsed() }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::LlmClientBuilder;
    use crate::llm::mock::server;
    use ctxwin_core::Role;

    fn job(id: u64) -> Job {
        Job::Summary(SummaryJob {
            summary_id: id,
            fingerprint: 7,
            generation: 0,
            previous: None,
            messages: vec![ChatMessage::text(
                Role::User,
                "Please rename load_cfg to load_config in src/main.rs and src/config.rs",
            )],
            covers: vec![(1, 1)],
            max_tokens: 50,
        })
    }

    #[test]
    fn outcomes_come_back_in_order_and_pending_counts_down() {
        let url = server(vec!["Rename load_cfg in two files.".into(), " ".into()]);
        let mut worker = Worker::spawn(LlmClientBuilder::new(url).build().unwrap()).unwrap();
        assert!(matches!(worker.next(Duration::ZERO), Next::Idle));
        worker.send(job(1)).unwrap();
        worker.send(job(2)).unwrap();
        assert_eq!(worker.pending(), 2);
        let mut seen = Vec::new();
        while worker.pending() > 0 {
            if let Next::Ready(outcome) = worker.next(Duration::from_secs(10)) {
                let Outcome::Summary { job, result, .. } = *outcome else { panic!("{outcome:?}") };
                assert!(job.messages.is_empty());
                seen.push((job.summary_id, result.is_ok()));
            }
        }
        assert_eq!(seen, [(1, true), (2, false)]);
    }
}
