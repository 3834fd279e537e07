//! Group commit of lease creates on SQLite.
//!
//! SQLite has one writer at a time, so concurrent creates queue for the write lock, and each
//! one's transaction pays its fixed costs (BEGIN, the inventory version read, COMMIT, and the
//! hand-offs to sqlx's connection thread in between) while every other create waits. Here one
//! task takes every create waiting at that moment and writes them in one transaction, each
//! inside its own savepoint: a create that fails (not enough hosts, say) is rolled back to its
//! savepoint alone and answered with its error; the others commit together.
//!
//! Each create still runs its own candidate search against the database, after the ones
//! before it in the batch, so no two creates in a batch can take the same resource; the
//! database's overlap trigger stays the last line of defence.

use tokio::sync::{mpsc, oneshot};

use blazar_core::LeaseView;

use crate::leases::LeasePlan;
use crate::{Service, ServiceError, ServiceResult};

/// Creates written in one transaction at most (bounds the time any one create waits).
const MAX_BATCH: usize = 64;

struct Job {
    service: Service,
    plan: LeasePlan,
    /// The global request id of the create's API call: the writer thread runs outside the
    /// request's task, so what the create records (actions, webhook deliveries) gets it here.
    request_id: Option<String>,
    reply: oneshot::Sender<ServiceResult<LeaseView>>,
}

/// Runs `fut` as part of the request `id` names, if any.
async fn as_request<F: std::future::Future>(id: &Option<String>, fut: F) -> F::Output {
    match id {
        Some(id) => crate::with_request_id(id.clone(), fut).await,
        None => fut.await,
    }
}

/// The queue of creates waiting for the writer task.
pub(crate) struct CreateBatcher {
    queue: mpsc::UnboundedSender<Job>,
}

impl CreateBatcher {
    /// Starts the writer on a thread of its own. It ends when the last [`CreateBatcher`]
    /// handle is dropped.
    ///
    /// A batch makes a few round trips to the database per create, and on a busy server each
    /// wake-up of a task in the shared runtime queues behind every HTTP request being parsed
    /// or answered. The writer's own thread is woken straight away, which is what keeps the
    /// one writer, and so every create, moving.
    pub(crate) fn start() -> std::io::Result<CreateBatcher> {
        let (queue, jobs) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("blazar-writer".into())
            .spawn(move || runtime.block_on(write_batches(jobs)))?;
        Ok(CreateBatcher { queue })
    }

    /// Writes a new lease in the next batch.
    pub(crate) async fn create(
        &self,
        service: &Service,
        plan: LeasePlan,
    ) -> ServiceResult<LeaseView> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            service: service.clone(),
            plan,
            request_id: crate::current_request_id(),
            reply,
        };
        if let Err(mpsc::error::SendError(job)) = self.queue.send(job) {
            // The writer is gone (the runtime is shutting down): write it alone.
            return job.service.write_new_lease_alone(&job.plan).await;
        }
        answer
            .await
            .map_err(|_| ServiceError::Internal("the lease writer stopped".into()))?
    }
}

async fn write_batches(mut jobs: mpsc::UnboundedReceiver<Job>) {
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        if batch.len() == 1 {
            // Nobody to share a transaction with: the plain path, retries included.
            one_by_one(batch).await;
        } else {
            write_batch(batch).await;
        }
    }
}

/// Writes `batch` in one transaction. A create the database itself failed (an error that is
/// not the create's own refusal) cannot be told apart from the writes queued before it, so
/// the whole batch is then written again one create at a time; so it is if the commit fails.
async fn write_batch(batch: Vec<Job>) {
    let Some(service) = batch.first().map(|j| j.service.clone()) else {
        return;
    };
    let mut tx = match service.store().write().await {
        Ok(tx) => tx,
        Err(e) => {
            tracing::debug!(error = %e, "could not open a batch transaction");
            return one_by_one(batch).await;
        }
    };
    let mut done: Vec<(Job, ServiceResult<LeaseView>)> = Vec::with_capacity(batch.len());
    let mut jobs = batch.into_iter();
    while let Some(job) = jobs.next() {
        match write_one(&mut tx, &job).await {
            Ok(result) => done.push((job, result)),
            Err(e) => {
                tracing::debug!(error = %e, "batched create failed in the database; writing the batch one by one");
                drop(tx);
                let all = done
                    .into_iter()
                    .map(|(job, _)| job)
                    .chain(std::iter::once(job))
                    .chain(jobs)
                    .collect();
                return one_by_one(all).await;
            }
        }
    }
    if let Err(e) = tx.commit().await {
        tracing::warn!(error = %e, "batch commit failed; writing the batch one by one");
        return one_by_one(done.into_iter().map(|(job, _)| job).collect()).await;
    }
    for (job, result) in done {
        let _ = job.reply.send(result);
    }
}

async fn one_by_one(jobs: Vec<Job>) {
    for job in jobs {
        let result = as_request(
            &job.request_id,
            job.service.write_new_lease_alone(&job.plan),
        )
        .await;
        let _ = job.reply.send(result);
    }
}

/// One create inside the batch's transaction, in a savepoint of its own. `Ok` holds the
/// create's answer, its refusal included (rolled back to the savepoint); `Err` is a failure
/// of the database, after which the transaction is not to be trusted.
async fn write_one(
    tx: &mut blazar_db::Tx,
    job: &Job,
) -> Result<ServiceResult<LeaseView>, ServiceError> {
    let savepoint = tx.savepoint().await?;
    match as_request(&job.request_id, job.service.write_new_lease(tx, &job.plan)).await {
        Ok(view) => {
            tx.release(savepoint).await?;
            Ok(Ok(view))
        }
        Err(
            e @ (ServiceError::Retry(_)
            | ServiceError::RetryAfter { .. }
            | ServiceError::Internal(_)
            | ServiceError::Unavailable(_)),
        ) => Err(e),
        Err(refusal) => {
            tx.rollback_to(savepoint).await?;
            Ok(Err(refusal))
        }
    }
}
