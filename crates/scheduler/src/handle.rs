//! The scheduler thread and the handle callers submit through. A request's events arrive on
//! its own bounded channel, sized to hold its whole output so the scheduler never blocks on a
//! slow reader; dropping the [`RequestStream`] cancels the request before the next step.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use lmi_engine_core::engine::StepEngine;
use lmi_text::Tokenizer;
use tokio::sync::mpsc as tmpsc;

use crate::error::SubmitError;
use crate::event::Event;
use crate::metrics::SchedulerMetrics;
use crate::pooling::check_pooling;
use crate::request::{AdapterId, AdapterRef, GenerateRequest, PoolingRequest};
use crate::scheduler::{Scheduler, SchedulerConfig, check_request};
use crate::sequence::RequestId;

enum Command {
    Submit {
        id: RequestId,
        req: Box<GenerateRequest>,
        tx: tmpsc::Sender<Event>,
    },
    SubmitPooling {
        id: RequestId,
        req: PoolingRequest,
        tx: tmpsc::Sender<Event>,
    },
    PinAdapter {
        adapter: AdapterRef,
        reply: tokio::sync::oneshot::Sender<Result<(), String>>,
    },
    RetireAdapter(AdapterId),
}

/// Static facts about the running scheduler that callers validate against.
#[derive(Debug, Clone)]
pub struct Limits {
    pub config: SchedulerConfig,
    pub num_blocks: usize,
    pub eos_token_ids: Vec<u32>,
    pub vocab_size: usize,
    /// An embedding or scoring model's pooling (None: a generative model).
    pub pooler: Option<lmi_checkpoint::pooling::PoolerInfo>,
}

/// A cheap, cloneable way to submit requests to the scheduler thread.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    limits: Arc<Limits>,
    metrics: Arc<SchedulerMetrics>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

/// The events of one request. Dropping it cancels the request.
pub struct RequestStream {
    pub id: RequestId,
    rx: tmpsc::Receiver<Event>,
}

impl RequestStream {
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// For callers outside an async runtime (batch tools, tests).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
}

impl Handle {
    /// Starts the scheduler thread, which owns `engine` from now on.
    pub fn spawn(
        engine: Box<dyn StepEngine>,
        tokenizer: Tokenizer,
        config: SchedulerConfig,
    ) -> Handle {
        Self::spawn_scheduler(Scheduler::new(engine, tokenizer, config))
    }

    /// [`Handle::spawn`] with a draft model for speculative decoding; refused when its
    /// vocabulary differs from the model's.
    pub fn spawn_with_draft_model(
        engine: Box<dyn StepEngine>,
        draft: Box<dyn StepEngine>,
        tokenizer: Tokenizer,
        config: SchedulerConfig,
    ) -> Result<Handle, String> {
        let scheduler = Scheduler::new(engine, tokenizer, config).with_draft_model(draft)?;
        Ok(Self::spawn_scheduler(scheduler))
    }

    fn spawn_scheduler(scheduler: Scheduler) -> Handle {
        let limits = Arc::new(Limits {
            config: scheduler.config().clone(),
            num_blocks: scheduler.pool().num_blocks(),
            eos_token_ids: scheduler.eos_token_ids().to_vec(),
            vocab_size: scheduler.engine().model_config().vocab_size,
            pooler: scheduler.engine().pooler().cloned(),
        });
        let metrics = scheduler.metrics();
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("lmi-scheduler".into())
            .spawn(move || run(scheduler, rx))
            .expect("spawning the scheduler thread");
        Handle {
            tx,
            next_id: Arc::new(AtomicU64::new(1)),
            limits,
            metrics,
            thread: Arc::new(Mutex::new(Some(thread))),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn metrics(&self) -> &SchedulerMetrics {
        &self.metrics
    }

    /// Queues a request without waiting for the scheduler thread (callers may be async).
    /// Requests that can never run, or that find the queue full, are refused here with the
    /// reason; a refusal the scheduler finds later arrives as `Event::Error` on the stream.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestStream, SubmitError> {
        check_request(
            &req,
            &self.limits.config,
            self.limits.num_blocks,
            self.limits.vocab_size,
        )?;
        let max_waiting = self.limits.config.max_waiting;
        if self.metrics.waiting.load(Relaxed) as usize >= max_waiting {
            return Err(SubmitError::QueueFull(max_waiting));
        }
        let capacity = req.num_seqs() * (req.stopping.max_new_tokens + 2) + 2;
        let (tx, rx) = tmpsc::channel(capacity);
        let id = self.next_id.fetch_add(1, Relaxed);
        self.tx
            .send(Command::Submit {
                id,
                req: Box::new(req),
                tx,
            })
            .map_err(|_| SubmitError::Stopped)?;
        Ok(RequestStream { id, rx })
    }

    /// Queues an embedding or scoring request (a model with a pooler); its stream carries
    /// one [`Event::Pooled`] or an [`Event::Error`].
    /// Inputs that can never run one step (longer than the step's token budget, the
    /// model's length or the KV pool) are refused here with the limit named.
    pub fn submit_pooling(&self, req: PoolingRequest) -> Result<RequestStream, SubmitError> {
        let l = &self.limits;
        check_pooling(
            &req,
            &l.config,
            (l.num_blocks > 0).then_some(l.num_blocks),
            l.vocab_size,
            l.pooler.is_some(),
        )?;
        let max_waiting = self.limits.config.max_waiting;
        if self.metrics.waiting.load(Relaxed) as usize >= max_waiting {
            return Err(SubmitError::QueueFull(max_waiting));
        }
        let (tx, rx) = tmpsc::channel(2);
        let id = self.next_id.fetch_add(1, Relaxed);
        self.tx
            .send(Command::SubmitPooling { id, req, tx })
            .map_err(|_| SubmitError::Stopped)?;
        Ok(RequestStream { id, rx })
    }

    /// Pins a LoRA adapter (its weights loaded) into the engine: never evicted from then on.
    /// Err("No free lora slots") when pins alone would fill every slot.
    pub async fn pin_adapter(&self, adapter: AdapterRef) -> Result<(), String> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Command::PinAdapter { adapter, reply })
            .map_err(|_| "the scheduler has stopped".to_string())?;
        rx.await
            .map_err(|_| "the scheduler has stopped".to_string())?
    }

    /// Tells the scheduler an adapter is unregistered: unpinned, and unloaded from the engine
    /// once no running sequence uses it.
    pub fn retire_adapter(&self, id: AdapterId) {
        let _ = self.tx.send(Command::RetireAdapter(id));
    }

    /// Stops taking requests and waits until every queued one has finished.
    pub fn shutdown(self) {
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        drop(self.tx);
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// How long the loop waits for a command when every waiting request waits for its adapter
/// (weights loading off this thread, or a slot to free).
const IDLE_POLL: std::time::Duration = std::time::Duration::from_millis(2);

fn run(mut s: Scheduler, rx: mpsc::Receiver<Command>) {
    let mut open = true;
    let mut stalled = false;
    loop {
        if !s.has_work() {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(cmd) => handle(&mut s, cmd),
                Err(_) => return,
            }
        } else if stalled && open {
            match rx.recv_timeout(IDLE_POLL) {
                Ok(cmd) => handle(&mut s, cmd),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        } else if stalled {
            std::thread::sleep(IDLE_POLL);
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => handle(&mut s, cmd),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        stalled = !s.step();
    }
}

fn handle(s: &mut Scheduler, cmd: Command) {
    match cmd {
        Command::Submit { id, req, tx } => {
            if let Err(e) = s.add(id, *req, tx.clone()) {
                let _ = tx.try_send(Event::Error(e.to_string()));
            }
        }
        Command::SubmitPooling { id, req, tx } => {
            if let Err(e) = s.add_pooling(id, req, tx.clone()) {
                let _ = tx.try_send(Event::Error(e.to_string()));
            }
        }
        Command::PinAdapter { adapter, reply } => {
            let _ = reply.send(s.pin_adapter(&adapter));
        }
        Command::RetireAdapter(id) => s.retire_adapter(id),
    }
}
