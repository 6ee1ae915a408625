/**
 * The lock item schema: one DynamoDB item per lock, shared by the state machines we synthesize, the
 * simulator that runs them and (later) the reconciler and the CLI. Nothing else may spell these names.
 *
 * An item looks like this:
 *
 *   lockName     (S, partition key)  the lock's name
 *   permitsInUse (N)                 how many permits are held
 *   concurrencyLimit (N)             the limit of the last acquire that succeeded (for `status`;
 *                                    every acquire brings its own limit)
 *   <holder id>  (M)                 one top-level attribute per holder, named by its id (for a
 *                                    workflow, the execution ARN): { acquiredAt: S (ISO-8601),
 *                                    redriveCount?: N (executions: the run that took it),
 *                                    leaseSeconds?: N (workflow leases), leaseExpiresAt?: N (epoch
 *                                    ms, leases of holders that are not executions), owner?: S }
 *
 * Holders are top-level attributes rather than entries of a map because `SET holders.#h = ...` fails
 * when the map does not exist yet, which would need a separate "initialize the item" step (the AWS
 * sample's, at two extra transitions on every first use). `UpdateItem` creates the item on first use.
 */

/** Partition key of the lock table (type S). */
export const LOCK_KEY = 'lockName';

/** Number of permits currently held (type N). Never below the number of holder attributes. */
export const PERMITS_IN_USE = 'permitsInUse';

/**
 * The concurrency limit the last successful acquire used (type N). Informational: each acquire
 * compares with its own limit; the CLI shows it and uses it when given no `--limit`.
 */
export const CONCURRENCY_LIMIT = 'concurrencyLimit';

/** Field of a holder entry (a map) with the time the permit was taken, ISO-8601. */
export const HOLDER_ACQUIRED_AT = 'acquiredAt';

/** Field of a holder entry: how long a workflow execution may hold the permit, in seconds. */
export const HOLDER_LEASE_SECONDS = 'leaseSeconds';

/**
 * Field of a holder entry that is an execution: which run of it took the permit (`$$.Execution.RedriveCount`,
 * 0 before any redrive), so that the cleanup of an earlier run never frees the permit of a later one.
 */
export const HOLDER_REDRIVE_COUNT = 'redriveCount';

/** Field of a holder entry that is not an execution: when its lease ends, epoch milliseconds. */
export const HOLDER_LEASE_EXPIRES_AT = 'leaseExpiresAt';

/** Whether a holder id is a Step Functions execution (else it is a lease id of a script or an operator). */
export function isExecutionHolder(holderId: string): boolean {
  return /^arn:aws[a-z-]*:states:[^:]*:\d*:execution:/.test(holderId);
}

/** Expression attribute names used by every expression below. */
export const NAMES = {
  permits: '#permits',
  holder: '#holder',
  limit: '#limit',
  fence: '#fence',
} as const;

/** Expression attribute values used by every expression below. */
export const VALUES = {
  zero: ':zero',
  one: ':one',
  limit: ':limit',
  entry: ':entry',
  expiresAt: ':expiresAt',
  acquiredAt: ':acquiredAt',
  redriveCount: ':redriveCount',
} as const;

/**
 * The lock's fencing counter (type N): one more on every acquisition, hand-offs from the queue
 * included, so that the number an acquisition returns strictly increases per lock. A downstream
 * system that remembers the highest number it has seen can reject a write from a stale holder.
 */
export const FENCING_TOKEN = 'fencingToken';

/**
 * Acquire: one conditional write both checks and takes a permit. `<` rather than `<>`, so that a lowered
 * limit never opens the gate.
 *
 * An execution that holds a permit already (its own acquire landed after it was stopped, and it was
 * redriven; or a write whose response was lost) must not take a second one, nor wait beside its own:
 * it must find out, and claim the one it has. A refused condition cannot say why it was refused, so
 * the condition lets the holder's own entry through, and the update then fails on it: the fencing
 * counter adds `if_not_exists(holder, 1)`, a number where the holder has no entry and its map where
 * it has one, which DynamoDB rejects with a ValidationException ("An operand in the update expression
 * has an incorrect data type"; Step Functions: `DynamoDB.AmazonDynamoDBException`). So the write
 * takes a permit, is refused (ConditionalCheckFailed: the lock is full), or fails because the holder
 * holds one (validation): three outcomes in one write, and an uncertain acquire can simply be retried.
 * @see https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_UpdateItem.html (ValidationException)
 */
export const ACQUIRE_CONDITION = `attribute_not_exists(${NAMES.permits}) OR ${NAMES.permits} < ${VALUES.limit} OR attribute_exists(${NAMES.holder})`;
export const ACQUIRE_UPDATE = `SET ${NAMES.permits} = if_not_exists(${NAMES.permits}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder} = ${VALUES.entry}, ${NAMES.limit} = ${VALUES.limit}, ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + if_not_exists(${NAMES.holder}, ${VALUES.one})`;

/**
 * Acquire by a client (the CLI, scripts): as ACQUIRE_CONDITION, and also below the limit stored on the
 * item, so that a client's limit can lower the gate but never raise it above the workflows' (the
 * effective limit is the smaller of the two). The update records the client's limit only on a lock
 * that has none yet; workflows keep writing theirs on every acquire.
 */
export const CLIENT_ACQUIRE_CONDITION = `(attribute_not_exists(${NAMES.permits}) OR (${NAMES.permits} < ${VALUES.limit} AND (attribute_not_exists(${NAMES.limit}) OR ${NAMES.permits} < ${NAMES.limit}))) AND attribute_not_exists(${NAMES.holder})`;
export const CLIENT_ACQUIRE_UPDATE = `SET ${NAMES.permits} = if_not_exists(${NAMES.permits}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder} = ${VALUES.entry}, ${NAMES.limit} = if_not_exists(${NAMES.limit}, ${VALUES.limit}), ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + ${VALUES.one}`;

/**
 * Release: the mirror image, conditional on the holder entry, which makes release and every cleanup
 * idempotent: a second release of the same holder fails its condition instead of freeing a permit twice.
 */
export const RELEASE_CONDITION = `attribute_exists(${NAMES.holder})`;
export const RELEASE_UPDATE = `SET ${NAMES.permits} = ${NAMES.permits} - ${VALUES.one} REMOVE ${NAMES.holder}`;

/**
 * Release of an expired lease: as RELEASE_CONDITION, and only if the lease was not renewed since it
 * was read, so that a sweep never frees a permit its holder just extended.
 */
export const RELEASE_EXPIRED_LEASE_CONDITION = `attribute_exists(${NAMES.holder}) AND ${NAMES.holder}.${HOLDER_LEASE_EXPIRES_AT} = ${VALUES.expiresAt}`;

/** A holder entry stamped by the run `:redriveCount` or an earlier one (entries of leases carry no run). */
const STAMPED_AT_MOST = `(attribute_not_exists(${NAMES.holder}.${HOLDER_REDRIVE_COUNT}) OR ${NAMES.holder}.${HOLDER_REDRIVE_COUNT} <= ${VALUES.redriveCount})`;

/**
 * Release by the cleanup of a stopped run: as RELEASE_CONDITION, and only if the permit was taken by
 * that run or an earlier one. A status event delivered late (or twice) after the execution was
 * redriven must not free the permit its new run took (every way into the body stamps the run).
 */
export const RELEASE_STOPPED_RUN_CONDITION = `attribute_exists(${NAMES.holder}) AND ${STAMPED_AT_MOST}`;

/**
 * Release by a sweep of a holder it judged dead: as RELEASE_CONDITION, and only if the entry is still
 * the one it read (a redriven execution keeps its ARN, and a claim renews the entry's acquire time)
 * and stamped by the run it judged dead or an earlier one.
 */
export const RELEASE_SEEN_HOLDER_CONDITION = `attribute_exists(${NAMES.holder}) AND ${NAMES.holder}.${HOLDER_ACQUIRED_AT} = ${VALUES.acquiredAt} AND ${STAMPED_AT_MOST}`;

/**
 * Claim a permit this execution holds, for its current run: the one handed to it while it did not
 * wait (a lost wake-up), the one its acquire found (taken by a write of an earlier run that landed
 * late, or by one whose response was lost), or the one the redrive guard takes again. The entry gets
 * the run's stamp and a new acquire time, so that nothing that judged an earlier run (its late
 * cleanup, a sweep that read the entry before, a releaser that handed it over) frees it any more; it
 * is marked claimed (a releaser no longer takes it back); a fresh fencing token is drawn; and the
 * waiter's token goes, so that an entry it may still have in the queue can only be dropped, never
 * handed a second permit. Refused when the holder has no entry, or one stamped by a later run.
 */
export const CLAIM_CONDITION = `attribute_exists(${NAMES.holder}) AND ${STAMPED_AT_MOST}`;

/** Longest lock name we accept; far below DynamoDB's 2,048-byte partition key limit. */
export const MAX_LOCK_NAME_LENGTH = 255;

/*
 * The queue of waiters (the `queue` wait strategy). An execution that finds the lock full appends
 * itself to the item's `waiters` list, in the same conditional write that checks the lock is still
 * full, and sleeps in a `.waitForTaskToken` task. A release that finds waiters does not give the
 * permit back: it hands it to the oldest waiter (the holder entry moves, the count stays) and wakes
 * it with SendTaskSuccess. Newcomers can only take a permit that is really free, so while the queue
 * works nobody barges in ahead of a waiter.
 */

/** The waiters, oldest first (type L of M): { id: S, redriveCount: N, leaseSeconds: N (0: none) }. */
export const WAITERS = 'waiters';
/** Field of a waiter: its execution ARN. */
export const WAITER_ID = 'id';
/**
 * A waiter's task token lives beside the queue, in a top-level attribute of its own (type S) named
 * by this prefix, the run that waits and its execution ARN (`waitToken:<run>:<arn>`), present exactly
 * while its entry is in the queue: a waiter whose wait timed out renews its token there and keeps its
 * place, where a token inside the list could only be replaced by queueing again at the end. The writes
 * that remove an entry remove it too. The run is part of the name, so that a run redriven while its
 * stopped run's entry is still queued waits on an entry of its own, never renews the old one, and is
 * never handed a permit stamped with the old run.
 */
export const WAIT_TOKEN_PREFIX = 'waitToken:';
/** The attribute with the task token of a waiter's current wait. */
export function waitTokenAttribute(executionArn: string, run: number | string): string {
  return `${WAIT_TOKEN_PREFIX}${run}:${executionArn}`;
}
/** The same name as a States.Format template: the run, then the ARN. */
export const WAIT_TOKEN_FORMAT = `${WAIT_TOKEN_PREFIX}{}:{}`;
/**
 * A copy of the queue's head that a releaser writes in the same update that reads it back (type M,
 * no `acquiredAt`, so never mistaken for a holder). Concurrent releasers overwrite it; each has its
 * own copy in its update's response.
 */
export const NEXT_WAITER = 'nextWaiter';
/** Field of a holder entry that came from the reconciler's queue service: the fencing token it was handed. */
export const HOLDER_FENCING_TOKEN = 'fencingToken';
/**
 * Field of a holder entry that a release handed to a waiter: an id the releaser drew (a UUID), by
 * which it tells its own hand-off from anyone else's when it confirms or takes it back.
 */
export const HOLDER_HANDOFF_ID = 'handoffId';
/**
 * Field of a holder entry that came from the queue, set when its execution found it without being
 * woken: from then on the releaser that handed it over no longer takes it back.
 */
export const HOLDER_CLAIMED = 'claimed';
/**
 * Most waiters one lock queues. An entry takes up to about 2.3 KB (a task token is up to 2,048
 * characters) and the item at most 400 KB; an execution that finds the queue full polls instead.
 */
export const MAX_WAITERS = 100;

/** Expression attribute names of the queue's expressions (with NAMES). */
export const QUEUE_NAMES = {
  waiters: '#waiters',
  next: '#next',
  head: '#head',
  /** The waiter's own wait-token attribute (waitTokenAttribute). */
  token: '#token',
  /** The queue head's wait-token attribute. */
  headToken: '#headToken',
} as const;

/** Expression attribute values of the queue's expressions (with VALUES). */
export const QUEUE_VALUES = {
  emptyList: ':emptyList',
  me: ':me',
  maxWaiters: ':maxWaiters',
  headId: ':headId',
  fence: ':fence',
  handoffId: ':handoffId',
  claimed: ':claimed',
  token: ':token',
} as const;

const NO_WAITERS = `(attribute_not_exists(${QUEUE_NAMES.waiters}) OR size(${QUEUE_NAMES.waiters}) = ${VALUES.zero})`;

/**
 * Enqueue: append a waiter only while the lock is full (so a release that races the enqueue either
 * sees the waiter and hands it the permit, or frees a permit that makes this condition fail and the
 * waiter try again), the execution holds nothing, is not queued already, and the queue has room.
 */
export const ENQUEUE_CONDITION = `${NAMES.permits} >= ${VALUES.limit} AND attribute_not_exists(${NAMES.holder}) AND attribute_not_exists(${QUEUE_NAMES.token}) AND (attribute_not_exists(${QUEUE_NAMES.waiters}) OR size(${QUEUE_NAMES.waiters}) < ${QUEUE_VALUES.maxWaiters})`;
export const ENQUEUE_UPDATE = `SET ${QUEUE_NAMES.waiters} = list_append(if_not_exists(${QUEUE_NAMES.waiters}, ${QUEUE_VALUES.emptyList}), ${QUEUE_VALUES.me}), ${QUEUE_NAMES.token} = ${QUEUE_VALUES.token}`;

/**
 * Wait again in the same place (after a wait timed out): a new token for the entry it still has, on
 * the same terms as the enqueue. Refused once the entry is gone (served, dropped) or a permit is free.
 */
export const RENEW_WAIT_CONDITION = `${NAMES.permits} >= ${VALUES.limit} AND attribute_not_exists(${NAMES.holder}) AND attribute_exists(${QUEUE_NAMES.token})`;
export const RENEW_WAIT_UPDATE = `SET ${QUEUE_NAMES.token} = ${QUEUE_VALUES.token}`;

/**
 * Release when nobody waits: RELEASE_STOPPED_RUN_CONDITION and an empty queue. Every release that
 * frees a permit checks the queue in the same write, so that a waiter that enqueued meanwhile is
 * never left asleep beside a free permit (its enqueue needed the lock full, and the lock stays full).
 */
export const RELEASE_IF_NO_WAITERS_CONDITION = `${RELEASE_STOPPED_RUN_CONDITION} AND ${NO_WAITERS}`;

/**
 * Is the permit still held (by the run)? A no-op write that fails when it is not: after a release and
 * a peek both failed (the queue emptied, then filled again, between them), it tells "given back
 * already" from "look at the queue again".
 */
export const STILL_HELD_CONDITION = RELEASE_STOPPED_RUN_CONDITION;
export const STILL_HELD_UPDATE = `SET ${NAMES.permits} = ${NAMES.permits}`;

/** Read the queue's head while still holding the permit to hand it (a write: reads are not conditional). */
export const PEEK_CONDITION = `${RELEASE_STOPPED_RUN_CONDITION} AND size(${QUEUE_NAMES.waiters}) > ${VALUES.zero}`;
export const PEEK_UPDATE = `SET ${QUEUE_NAMES.next} = ${QUEUE_NAMES.waiters}[0]`;

/**
 * Hand off: the holder entry moves from the releaser to the head, which leaves the queue; the count
 * stays; the head's token goes too. The same write draws the head's fencing token, so that tokens
 * follow the order in which permits are granted. The releaser reads the head's token and the counter
 * before the draw from the response (UPDATED_OLD: the token is the only string among the attributes
 * the update touches; the new token is the old counter plus one). Conditional on the head being the
 * one read (another releaser may have served it), not holding a permit already (it found one by
 * polling), and having a token (so that the response carries one to wake it with).
 */
export const HAND_OFF_CONDITION = `${RELEASE_STOPPED_RUN_CONDITION} AND ${QUEUE_NAMES.waiters}[0].id = ${QUEUE_VALUES.headId} AND attribute_not_exists(${QUEUE_NAMES.head}) AND attribute_exists(${QUEUE_NAMES.headToken})`;
export const HAND_OFF_UPDATE = `SET ${QUEUE_NAMES.head} = ${VALUES.entry}, ${NAMES.fence} = ${NAMES.fence} + ${VALUES.one} REMOVE ${NAMES.holder}, ${QUEUE_NAMES.waiters}[0], ${QUEUE_NAMES.headToken}`;

/** Drop a queue head that already holds a permit (it got one by polling), or that has no token to wake it by. */
export const DROP_HEAD_CONDITION = `${QUEUE_NAMES.waiters}[0].id = ${QUEUE_VALUES.headId} AND (attribute_exists(${QUEUE_NAMES.head}) OR attribute_not_exists(${QUEUE_NAMES.headToken}))`;
export const DROP_HEAD_UPDATE = `REMOVE ${QUEUE_NAMES.waiters}[0], ${QUEUE_NAMES.headToken}`;

/**
 * After a server error on the hand-off: did it land? Its hand-off id is unique, so the head's entry
 * carries it if and only if it did.
 */
export const CONFIRM_HAND_OFF_CONDITION = `${QUEUE_NAMES.head}.${HOLDER_HANDOFF_ID} = ${QUEUE_VALUES.handoffId}`;
export const CONFIRM_HAND_OFF_UPDATE = `SET ${NAMES.fence} = ${NAMES.fence}`;

/**
 * Take back a permit handed to a waiter that could not be woken (its token is closed): the entry
 * moves back to the releaser, which then hands it on. Only the very entry it wrote, in the same run
 * (the hand-off id carries the releaser's run: redriven after a wake-up that was delivered, its call
 * again hears that the token is closed, and must not take back the permit the woken waiter uses),
 * and only if the waiter has not claimed it meanwhile (CLAIM_UPDATE).
 */
export const TAKE_BACK_CONDITION = `${QUEUE_NAMES.head}.${HOLDER_HANDOFF_ID} = ${QUEUE_VALUES.handoffId} AND attribute_not_exists(${QUEUE_NAMES.head}.${HOLDER_CLAIMED}) AND attribute_not_exists(${NAMES.holder})`;
export const TAKE_BACK_UPDATE = `SET ${NAMES.holder} = ${VALUES.entry} REMOVE ${QUEUE_NAMES.head}`;

/** CLAIM_CONDITION's update: the run's stamp, a new acquire time, `claimed`, a fencing token; the wait token goes. */
export const CLAIM_UPDATE = `SET ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder}.${HOLDER_CLAIMED} = ${QUEUE_VALUES.claimed}, ${NAMES.holder}.${HOLDER_ACQUIRED_AT} = ${VALUES.acquiredAt}, ${NAMES.holder}.${HOLDER_REDRIVE_COUNT} = ${VALUES.redriveCount} REMOVE ${QUEUE_NAMES.token}`;

/** The redrive guard's claim: as CLAIM_UPDATE, for an execution with no wait token to remove. */
export const GUARD_CLAIM_UPDATE = `SET ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder}.${HOLDER_CLAIMED} = ${QUEUE_VALUES.claimed}, ${NAMES.holder}.${HOLDER_ACQUIRED_AT} = ${VALUES.acquiredAt}, ${NAMES.holder}.${HOLDER_REDRIVE_COUNT} = ${VALUES.redriveCount}`;

/**
 * Acquire by a waiter that polls (its wait timed out): as ACQUIRE_UPDATE, and its wait token goes, so
 * that the entry it leaves in the queue is dropped by the releaser that reaches it instead of being
 * handed a second permit, which this execution would never claim.
 */
export const ACQUIRE_AS_WAITER_UPDATE = `${ACQUIRE_UPDATE} REMOVE ${QUEUE_NAMES.token}`;
