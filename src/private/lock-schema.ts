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
 *                                    workflow, `executionHolderKey` below): { a: S (acquired at, ISO-8601),
 *                                    r?: N (executions: the run that took it), l?: N (workflow
 *                                    lease, seconds), e?: N (lease of a holder that is not an
 *                                    execution: its end, epoch ms), o?: S (its owner), h?: S (hand-
 *                                    off id), c?: BOOL (claimed), f?: N (fencing token), p?, x?:
 *                                    N (weighted: permits, extra), b?: N (in body), k?: N (collecting) }
 *   fencingToken (N)                 one more on every acquisition (below)
 *   queueHead, queueTail (N)         the queue's counters; its waiters have items of their own (below)
 *
 * The fields of a holder entry (and of a ticket item, below) have one-letter names: an entry is
 * written into the lock item once per holder, and every write to the lock item is billed by the size
 * of the whole item, names included ("choose shorter attribute names rather than long ones ... can
 * lower the amount of RCU/WCUs you use":
 * https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html).
 * The constants below give each its meaning; only they may spell them.
 *
 * Holders are top-level attributes rather than entries of a map because `SET holders.#h = ...` fails
 * when the map does not exist yet, which would need a separate "initialize the item" step (the AWS
 * sample's, at two extra transitions on every first use). `UpdateItem` creates the item on first use.
 */

import { createHash } from 'crypto';

/** Partition key of the lock table (type S). */
export const LOCK_KEY = 'lockName';

/** Number of permits currently held (type N): the permits of the holder entries (one each, or a weighted entry's HOLDER_PERMITS). */
export const PERMITS_IN_USE = 'permitsInUse';

/**
 * The concurrency limit the last successful acquire used (type N). Informational: each acquire
 * compares with its own limit; the CLI shows it and uses it when given no `--limit`.
 */
export const CONCURRENCY_LIMIT = 'concurrencyLimit';

/**
 * The rate interval of the lock's rate-limited workflows, seconds (type N): each of their acquires
 * writes it, so that a client (the CLI) holds its permit as long and the rate counts its acquisitions.
 */
export const RATE_INTERVAL = 'rateIntervalSeconds';

/** Field of a holder entry (a map) with the time the permit was taken, ISO-8601. */
export const HOLDER_ACQUIRED_AT = 'a';

/**
 * Field of a holder entry that holds more than one of the lock's permits (a weighted acquisition,
 * `permits`): how many it holds (type N). An entry without it holds one. Every release gives back
 * exactly this many in the same write (RELEASE_UPDATE), whoever releases it. 0 on an entry that keeps
 * only its body slot: a rate's permit given back (or handed on) at the interval while a body that may
 * run longer keeps its slot (a concurrency limit above the rate's count, see KEEP_SLOT_RELEASE_CONDITION).
 */
export const HOLDER_PERMITS = 'p';

/**
 * Field of a weighted holder entry beside HOLDER_PERMITS: how many it holds beyond one (type N, the
 * permits less one). A hand-off gives the waiter an entry of one permit and gives these back in the
 * same write (HAND_OFF_UPDATE: an update expression has one `+` or `-` per value, so the entry keeps
 * both numbers), so that an entry handed off as a whole never leaves permits counted that nobody holds.
 */
export const HOLDER_EXTRA_PERMITS = 'x';

/** The most permits one acquisition may take (`permits`): see MAX_PERMITS_REASON. */
export const MAX_PERMITS = 100;

/**
 * Why MAX_PERMITS: a weighted holder that releases while executions wait in the queue hands its
 * permits on one at a time (SPLIT_HAND_OFF_UPDATE), about 30 history events each, and the release
 * must stay far inside the 25,000 events of an execution beside its wait's budget.
 */
export const MAX_PERMITS_REASON = 'a weighted release hands its permits to queued waiters one at a time, about 30 history events each';

/** Field of a holder entry: how long a workflow execution may hold the permit, in seconds. */
export const HOLDER_LEASE_SECONDS = 'l';

/**
 * Field of a holder entry that is an execution: which run of it took the permit (`$$.Execution.RedriveCount`,
 * 0 before any redrive), so that the cleanup of an earlier run never frees the permit of a later one.
 */
export const HOLDER_REDRIVE_COUNT = 'r';

/** Field of a holder entry that is not an execution: when its lease ends, epoch milliseconds. */
export const HOLDER_LEASE_EXPIRES_AT = 'e';

/**
 * The hash that names a state machine in an execution's holder id (`States.Hash` of its ARN): 32 hex
 * digits, where the ARN takes 48 characters and the state machine's name up to 80 more.
 */
export const STATE_MACHINE_KEY_HASH = 'MD5';

const EXECUTION_KEY = /^([0-9a-f]{32}):([^:]+)$/;
const EXECUTION_ARN = /^arn:(aws[a-z-]*):states:([^:]*):(\d*):execution:([^:]+):([^:]+)$/;

/**
 * An execution's holder id: the MD5 of its state machine's ARN (unqualified: no version or alias), `:`,
 * its name; 33 + up to 80 characters, where an execution ARN is 48 + up to 161. Every write of the lock
 * item is billed for the whole item, so the holder id, written once per holder entry, sets most of its
 * size. The name alone would not do: two workflows sharing a lock may name executions alike. The hash
 * covers the state machine's partition, Region and account as the ARN did (a table may be shared across
 * accounts). Execution and state machine names never contain `:` (Step Functions refuses them), so the
 * ARN splits into its fields unambiguously.
 */
export function executionHolderKey(stateMachineArn: string, executionName: string): string {
  return `${stateMachineKeyHash(stateMachineArn)}:${executionName}`;
}

/** What `States.Hash(<the unqualified ARN>, 'MD5')` returns: lower-case hex of the UTF-8 bytes' MD5. */
function stateMachineKeyHash(stateMachineArn: string): string {
  return createHash('md5').update(stateMachineArn.split(':').slice(0, 7).join(':'), 'utf8').digest('hex');
}

/** The holder id of an execution by its ARN; undefined for anything else. */
export function executionHolderKeyOfArn(executionArn: string): string | undefined {
  const m = EXECUTION_ARN.exec(executionArn);
  return m ? executionHolderKey(`arn:${m[1]}:states:${m[2]}:${m[3]}:stateMachine:${m[4]}`, m[5]) : undefined;
}

/**
 * The ARN of the execution a holder id names, given the ARNs of the state machines it may belong to;
 * undefined if none of them matches. A holder id written by a version before the short ids is the
 * ARN itself.
 */
export function executionArnOfHolder(holderId: string, stateMachineArns: readonly string[]): string | undefined {
  const prefixOf = (sm: string) => `${sm.split(':').slice(0, 7).join(':').replace(':stateMachine:', ':execution:')}:`;
  if (EXECUTION_ARN.test(holderId)) return stateMachineArns.some((sm) => holderId.startsWith(prefixOf(sm))) ? holderId : undefined;
  const m = EXECUTION_KEY.exec(holderId);
  if (!m) return undefined;
  const sm = stateMachineArns.find((arn) => stateMachineKeyHash(arn) === m[1]);
  return sm === undefined ? undefined : `${prefixOf(sm)}${m[2]}`;
}

/**
 * Whether a holder id is a Step Functions execution (else it is a lease id of a script or an operator,
 * which starts with `lease-`): a holder key, or the ARN a version before the short keys wrote.
 */
export function isExecutionHolder(holderId: string): boolean {
  return EXECUTION_KEY.test(holderId) || EXECUTION_ARN.test(holderId);
}

/** Expression attribute names used by every expression below. */
export const NAMES = {
  permits: '#permits',
  holder: '#holder',
  limit: '#limit',
  fence: '#fence',
  rate: '#rate',
  collecting: '#collecting',
  collectGate: '#collectGate',
  bodies: '#bodies',
  bodyLimit: '#bodyLimit',
} as const;

/*
 * The body slot (docs/design-rates-and-weights.md, "The body slot"): a workflow whose rate's count is
 * above its concurrency limit holds the lock's permits for the rate (PERMITS_IN_USE up to the count,
 * each held for the interval), and a slot for its body beside its permit (BODIES_RUNNING up to
 * BODY_LIMIT) only while the body runs.
 */

/**
 * Holders whose body counts against BODY_LIMIT (type N). Every entry that carries HOLDER_IN_BODY
 * counts one: RELEASE_UPDATE and HAND_OFF_UPDATE take the entry's mark off with the entry, whoever
 * releases it.
 */
export const BODIES_RUNNING = 'bodiesRunning';
/** How many bodies may run at once on a lock whose permits a rate holds (type N), recorded by each take of a slot. */
export const BODY_LIMIT = 'bodyLimit';
/** Field of a holder entry (type N, 1) whose body holds a slot: the mark every release takes off BODIES_RUNNING. */
export const HOLDER_IN_BODY = 'b';

/*
 * A weighted waiter of the queue (a workflow with `permits` and the queue strategy) is handed one
 * permit by an ordinary hand-off, then collects the rest: it registers as the lock's one collector,
 * and from then on nobody else takes a permit, and releases give theirs back (free) until enough are
 * free for it, after which they hand off to the waiters behind it as before. It takes them in one
 * write once `permitsInUse <= collectGate`. See docs/design-rates-and-weights.md ("A simpler plan").
 */

/**
 * Executions collecting permits on the lock (type N, 0 or 1). Every entry that carries
 * HOLDER_COLLECTING counts one: RELEASE_UPDATE takes the entry's mark off with the entry, whoever
 * releases it.
 */
export const COLLECTING = 'collecting';
/** While a collector collects: the limit less the permits it still needs (type N). It completes once `permitsInUse <= collectGate`. */
export const COLLECT_GATE = 'collectGate';
/** Field of the collector's holder entry (type N, 1): the mark RELEASE_UPDATE takes off the lock's COLLECTING. */
export const HOLDER_COLLECTING = 'k';

/** Expression attribute values used by every expression below. */
export const VALUES = {
  zero: ':zero',
  one: ':one',
  limit: ':limit',
  entry: ':entry',
  expiresAt: ':expiresAt',
  acquiredAt: ':acquiredAt',
  redriveCount: ':redriveCount',
  rate: ':rate',
  weight: ':weight',
  gate: ':gate',
  extra: ':extra',
  bodyLimit: ':bodyLimit',
} as const;

/** Nobody collects permits on the lock (see COLLECTING): a newcomer may take a free permit. */
export const NOT_COLLECTING = `(attribute_not_exists(${NAMES.collecting}) OR ${NAMES.collecting} = ${VALUES.zero})`;

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
export const ACQUIRE_CONDITION = `attribute_not_exists(${NAMES.permits}) OR (${NAMES.permits} < ${VALUES.limit} AND ${NOT_COLLECTING}) OR attribute_exists(${NAMES.holder})`;
export const ACQUIRE_UPDATE = `SET ${NAMES.permits} = if_not_exists(${NAMES.permits}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder} = ${VALUES.entry}, ${NAMES.limit} = ${VALUES.limit}, ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + if_not_exists(${NAMES.holder}, ${VALUES.one})`;
/** ACQUIRE_UPDATE of a rate-limited workflow: it also records the rate's interval (RATE_INTERVAL) for clients. */
export const ACQUIRE_WITH_RATE_UPDATE = `${ACQUIRE_UPDATE}, ${NAMES.rate} = ${VALUES.rate}`;

/**
 * Acquire of a weighted holder (`permits`, `:weight` of them): as ACQUIRE_CONDITION, with the gate
 * `permitsInUse <= :gate`, where `:gate` is the limit minus the weight (a condition cannot do
 * arithmetic, so the state machine computes it), and the entry records its weight (HOLDER_PERMITS).
 */
export const WEIGHTED_ACQUIRE_CONDITION = `attribute_not_exists(${NAMES.permits}) OR (${NAMES.permits} <= ${VALUES.gate} AND ${NOT_COLLECTING}) OR attribute_exists(${NAMES.holder})`;
export const WEIGHTED_ACQUIRE_UPDATE = `SET ${NAMES.permits} = if_not_exists(${NAMES.permits}, ${VALUES.zero}) + ${VALUES.weight}, ${NAMES.holder} = ${VALUES.entry}, ${NAMES.limit} = ${VALUES.limit}, ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + if_not_exists(${NAMES.holder}, ${VALUES.one})`;

/**
 * Acquire by a client (the CLI, scripts): as ACQUIRE_CONDITION, and also below the limit stored on the
 * item, so that a client's limit can lower the gate but never raise it above the workflows' (the
 * effective limit is the smaller of the two). The update records the client's limit only on a lock
 * that has none yet; workflows keep writing theirs on every acquire.
 */
export const CLIENT_ACQUIRE_CONDITION = `(attribute_not_exists(${NAMES.permits}) OR (${NAMES.permits} < ${VALUES.limit} AND (attribute_not_exists(${NAMES.limit}) OR ${NAMES.permits} < ${NAMES.limit}) AND ${NOT_COLLECTING})) AND attribute_not_exists(${NAMES.holder})`;
/**
 * Acquire of `:weight` permits by a client: as CLIENT_ACQUIRE, with the gate of WEIGHTED_ACQUIRE, and
 * the lock's stored limit at least the client's (a condition cannot subtract the weight from it: the
 * client applies the smaller of the two limits, read before, and tries again with the stored one if
 * it was lowered meanwhile).
 */
export const CLIENT_WEIGHTED_ACQUIRE_CONDITION = `(attribute_not_exists(${NAMES.permits}) OR (${NAMES.permits} <= ${VALUES.gate} AND (attribute_not_exists(${NAMES.limit}) OR ${NAMES.limit} >= ${VALUES.limit}) AND ${NOT_COLLECTING})) AND attribute_not_exists(${NAMES.holder})`;
export const CLIENT_WEIGHTED_ACQUIRE_UPDATE = `SET ${NAMES.permits} = if_not_exists(${NAMES.permits}, ${VALUES.zero}) + ${VALUES.weight}, ${NAMES.holder} = ${VALUES.entry}, ${NAMES.limit} = if_not_exists(${NAMES.limit}, ${VALUES.limit}), ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + ${VALUES.one}`;
export const CLIENT_ACQUIRE_UPDATE = `SET ${NAMES.permits} = if_not_exists(${NAMES.permits}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder} = ${VALUES.entry}, ${NAMES.limit} = if_not_exists(${NAMES.limit}, ${VALUES.limit}), ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + ${VALUES.one}`;

/**
 * A client acquire that names the lock's rate interval (`rateIntervalSeconds`, the CLI's `--rate-interval`):
 * it records the interval on a lock that records none yet (a lock no rate-limited execution has
 * acquired, or an item deleted to upgrade), so that this lease's release, and every client's, holds its
 * permit for it. A recorded interval stays: the workflows' acquires write their own on every acquire.
 */
export const CLIENT_RATE_UPDATE = `${NAMES.rate} = if_not_exists(${NAMES.rate}, ${VALUES.rate})`;
/** The longest rate interval, seconds: a day (Step Functions waits whole seconds). */
export const MAX_RATE_INTERVAL_SECONDS = 86_400;

/**
 * Release: the mirror image, conditional on the holder entry, which makes release and every cleanup
 * idempotent: a second release of the same holder fails its condition instead of freeing a permit twice.
 * It gives back what the entry holds, read from the entry in the same write (its HOLDER_PERMITS, or
 * one), so that every path frees exactly what was taken without knowing the holder's weight.
 */
export const RELEASE_CONDITION = `attribute_exists(${NAMES.holder})`;
/** The SET clause that takes an entry's body slot (HOLDER_IN_BODY) off the lock's BODIES_RUNNING, in every write that removes or moves the entry. */
const TAKE_OFF_BODY = `${NAMES.bodies} = if_not_exists(${NAMES.bodies}, ${VALUES.zero}) - if_not_exists(${NAMES.holder}.${HOLDER_IN_BODY}, ${VALUES.zero})`;
/** The SET clause that counts a body slot taken (the entry's HOLDER_IN_BODY is set beside it). */
const COUNT_BODY = `${NAMES.bodies} = if_not_exists(${NAMES.bodies}, ${VALUES.zero}) + ${VALUES.one}`;
/** A body slot is free under the lock's recorded BODY_LIMIT, or the lock records none (the client's and the redrive guard's takes). */
const BODY_SLOT_FREE = `(attribute_not_exists(${NAMES.bodyLimit}) OR attribute_not_exists(${NAMES.bodies}) OR ${NAMES.bodies} < ${NAMES.bodyLimit})`;
export const RELEASE_UPDATE =
  `SET ${NAMES.permits} = ${NAMES.permits} - if_not_exists(${NAMES.holder}.${HOLDER_PERMITS}, ${VALUES.one}), ` +
  `${NAMES.collecting} = if_not_exists(${NAMES.collecting}, ${VALUES.zero}) - if_not_exists(${NAMES.holder}.${HOLDER_COLLECTING}, ${VALUES.zero}), ` +
  `${TAKE_OFF_BODY} REMOVE ${NAMES.holder}`;

/**
 * Release of an expired lease: as RELEASE_CONDITION, and only if the lease was not renewed since it
 * was read, so that a sweep never frees a permit its holder just extended.
 */
export const RELEASE_EXPIRED_LEASE_CONDITION = `attribute_exists(${NAMES.holder}) AND ${NAMES.holder}.${HOLDER_LEASE_EXPIRES_AT} = ${VALUES.expiresAt}`;

/** A holder entry stamped by the run `:redriveCount` or an earlier one (entries of leases carry no run). */
export const STAMPED_AT_MOST = `(attribute_not_exists(${NAMES.holder}.${HOLDER_REDRIVE_COUNT}) OR ${NAMES.holder}.${HOLDER_REDRIVE_COUNT} <= ${VALUES.redriveCount})`;

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
 * is marked claimed (a releaser no longer takes it back); and a fresh fencing token is drawn. A ticket
 * it may still have in the queue is never handed a second permit: the hand-off is refused while the
 * execution holds an entry (HAND_OFF_CONDITION). Refused when the holder has no entry, or one stamped
 * by a later run.
 */
export const CLAIM_CONDITION = `attribute_exists(${NAMES.holder}) AND ${STAMPED_AT_MOST}`;

/**
 * CLAIM_CONDITION for a weighted holder (`:weight` permits): only an entry that still holds all of
 * them. A release of a stopped run may be handing its permits on one at a time (SPLIT_HAND_OFF); a
 * claim of such an entry would re-stamp it for the new run, stop that release, and let the body run
 * on fewer permits than it takes. Refused, the claimant waits for the release to finish.
 */
export const WEIGHTED_CLAIM_CONDITION = `${CLAIM_CONDITION} AND ${NAMES.holder}.${HOLDER_PERMITS} = ${VALUES.weight}`;

/**
 * Release of a weighted entry that holds fewer than `:weight` permits (some handed on by a release of
 * a stopped run, which a redrive interrupted), stamped by the run `:redriveCount` or an earlier one:
 * the redrive guard gives back what is left, then takes the whole weight again.
 */
export const RELEASE_PARTIAL_CONDITION = `${RELEASE_STOPPED_RUN_CONDITION} AND ${NAMES.holder}.${HOLDER_PERMITS} < ${VALUES.weight}`;

/** Longest lock name we accept; far below DynamoDB's 2,048-byte partition key limit. */
export const MAX_LOCK_NAME_LENGTH = 255;

/**
 * The most bytes one holder entry takes in the lock item, attribute name included (DynamoDB counts
 * names: "The attribute name counts towards the size limit"). An execution's: its ARN as the name, at
 * most 221 bytes (`arn:aws-us-gov:states:`, a 14-character Region, the account, `:execution:`, two
 * names of at most 80 ASCII characters), and a map of at most 94 bytes (each field its one-letter
 * name, its value and a byte: acquired at 26, run 5, lease 6, hand-off id 41, claimed 3, fencing
 * token 10; 3 for the map). A weighted entry adds permits and extra (4 each), and a weighted waiter of
 * the queue, handed its first permit, keeps the hand-off's id and adds collecting (4) while it
 * collects, without a fencing token: at most 96 bytes of map (an entry from the reconciler's queue
 * service carries a fencing token instead of the id: 65), so 317 with the longest ARN; with a body
 * slot's mark (b, 4) too, and every field at once, 331. A client's: a
 * 42-byte lease id and at most 190 bytes with an owner of MAX_OWNER_LENGTH and permits. The bound
 * below is the one from before the field names were shortened (379 bytes then): it keeps its margin.
 * https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html
 */
export const MAX_HOLDER_ENTRY_BYTES = 380;

/** Most bytes (UTF-8) of a client holder's `owner`, so that its entry stays within MAX_HOLDER_ENTRY_BYTES. */
export const MAX_OWNER_LENGTH = 100;

/**
 * The largest concurrency limit: the lock item then holds at most 1,000 entries of MAX_HOLDER_ENTRY_BYTES
 * (380,000 bytes) beside its counters and name (under 400 bytes), inside DynamoDB's 400 KB (409,600
 * bytes) per item with a margin of 29 KB. A write that would pass 400 KB fails with a ValidationException
 * that no catcher could tell from a bad request.
 */
export const MAX_CONCURRENCY_LIMIT = 1000;

/*
 * The queue of waiters (the `queue` wait strategy), kept out of the lock item so that no write's cost
 * grows with the queue: the lock item keeps two counters, and each waiter has a ticket item of its own.
 *
 *   lock item      queueTail (N): tickets issued; queueHead (N): tickets passed (served, dropped or
 *                  skipped). Waiters: tail - head. Both appear with the first ticket.
 *   ticket item    key `<lock name><US><ticket>` (US: the ASCII unit separator, which no lock name may
 *                  contain): w (S, the waiter's holder id), r (N, its run), l (N, its lease),
 *                  concurrencyLimit (N), t (S, the task token of its current wait), s
 *                  (S, set once its turn has come: the id of the hand-off that served it).
 *
 * An execution that finds the lock full takes a ticket in a conditional write that checks the lock
 * is still full, then writes its ticket item with its task token and sleeps in that `.waitForTaskToken`
 * task. A release that finds waiters does not give the permit back: it claims the next ticket, serves
 * it by deleting its item (which returns the waiter and its current token, and refuses any later wait
 * again on it), moves the holder entry to that waiter in one write on the lock item (the count
 * stays), and wakes it. Newcomers can only take a permit that is really free, so
 * nobody barges in ahead of a waiter.
 *
 * A ticket whose item is missing when its turn comes (taken by a write whose response was lost, or by
 * an execution stopped before it wrote it, or still on its way) is skipped: serving it creates the
 * item marked and without a waiter, so that a waiter still on its way is refused and takes a new ticket.
 */

/** Tickets issued by the lock (type N, on the lock item). */
export const QUEUE_TAIL = 'queueTail';
/** Tickets passed: served, dropped or skipped (type N, on the lock item). */
export const QUEUE_HEAD = 'queueHead';
/** At most this many stripes of a split lock (`lockStripes`): the cleanup reads each one for a stopped execution's permit. */
export const MAX_LOCK_STRIPES = 100;
/** The field of a split lock's execution state data that keeps its stripe, `{ name }` (see pickLockStripe). */
export const LOCK_STRIPE_FIELD = 'lockStripe';
/** Separates a split lock's name from its stripe's number: stripe 3 of lock `exports` is the lock `exports#3`. */
export const LOCK_STRIPE_SEPARATOR = '#';
/** The name of stripe `stripe` (0 to the stripes less one) of a split lock. */
export function lockStripeName(lockName: string, stripe: number): string {
  return `${lockName}${LOCK_STRIPE_SEPARATOR}${stripe}`;
}
/** Separates the lock name from the ticket in a ticket item's key. Lock names may not contain it. */
export const TICKET_KEY_SEPARATOR = '\u001f';
/** The key (`lockName` attribute) of a lock's ticket item. */
export function ticketKey(lockName: string, ticket: number | string): string {
  return `${lockName}${TICKET_KEY_SEPARATOR}${ticket}`;
}
/** Whether an item's key is a ticket item's (and not a lock's). */
export function isTicketKey(key: string): boolean {
  return key.includes(TICKET_KEY_SEPARATOR);
}
/** The key of a ticket item as a States.Format template: the lock name, then the ticket. */
export const TICKET_KEY_FORMAT = `{}${TICKET_KEY_SEPARATOR}{}`;
/** Field of a ticket item: the waiter's holder id (an execution's: `executionHolderKey`). */
export const TICKET_WAITER = 'w';
/** Field of a ticket item: the task token of the waiter's current wait. */
export const TICKET_WAIT_TOKEN = 't';
/**
 * Field of a ticket item, set once its turn has come, where the item stays: the id of the hand-off
 * that served it. A workflow's release serves a ticket with a waiter by deleting its item
 * (SERVE_TICKET_CONDITION); it marks a ticket without one, and the client and the reconciler's queue
 * service mark the tickets they serve (deleting them once the waiter was woken).
 */
export const TICKET_SERVED_BY = 's';
/** Field of a holder entry that came from the reconciler's queue service: the fencing token it was handed. */
export const HOLDER_FENCING_TOKEN = 'f';
/**
 * Field of a holder entry that a release handed to a waiter: the hand-off's id, by which the releaser
 * tells its own hand-off from anyone else's when it confirms or takes it back. A workflow's release
 * writes `<ticket>/<run>`: the ticket it claimed, which no other claim of the lock gets (PEEK_UPDATE
 * only ever raises the head; an operator who deletes a free lock item restarts it, but no entry
 * survives that, and a stale ticket item whose `s` a new id equals is only deleted), and the run of the releaser, so that
 * a run redriven after the hand-off never takes back a permit its earlier run handed on. Clients and
 * the reconciler's queue service draw a UUID, which no `<ticket>/<run>` equals.
 */
export const HOLDER_HANDOFF_ID = 'h';
/**
 * Field of a holder entry that came from the queue, set when its execution found it without being
 * woken: from then on the releaser that handed it over no longer takes it back.
 */
export const HOLDER_CLAIMED = 'c';

/** Expression attribute names of the queue's expressions (with NAMES). */
export const QUEUE_NAMES = {
  tail: '#tail',
  head: '#head',
  /** The holder entry of the waiter whose turn it is. */
  next: '#next',
  waiter: '#waiter',
  run: '#run',
  lease: '#lease',
  token: '#token',
  servedBy: '#servedBy',
} as const;

/** Expression attribute values of the queue's expressions (with VALUES). */
export const QUEUE_VALUES = {
  me: ':me',
  token: ':token',
  lease: ':lease',
  servedBy: ':servedBy',
  handoffId: ':handoffId',
  claimed: ':claimed',
} as const;

const NO_WAITERS = `(attribute_not_exists(${QUEUE_NAMES.tail}) OR ${QUEUE_NAMES.head} >= ${QUEUE_NAMES.tail})`;
/** A collector collects and still needs permits: a release gives its permit back (nobody else may take it). */
const COLLECTOR_SHORT = `(${NAMES.collecting} > ${VALUES.zero} AND ${NAMES.permits} > ${NAMES.collectGate})`;
/**
 * A collector collects: a newcomer queues behind it, even beside free permits (they are the
 * collector's; were more freed than it needs, a waiter finds one when its wait next times out).
 */
const COLLECTOR_WAITS = `${NAMES.collecting} > ${VALUES.zero}`;

/**
 * Take a ticket, only while the lock is full (so a release that races it either sees the waiter and
 * hands it the permit, or frees a permit that makes this condition fail and the waiter try again), or
 * a collector collects (COLLECTOR_WAITS), and the execution holds nothing. Its ticket is the new tail (UPDATED_NEW). A retried ticket whose first
 * write landed leaves an orphan ticket, which is skipped.
 */
export const TAKE_TICKET_CONDITION = `(${NAMES.permits} >= ${VALUES.limit} OR ${COLLECTOR_WAITS}) AND attribute_not_exists(${NAMES.holder})`;
/** Take a ticket for `:weight` permits: while more than `:gate` (the limit less them) are in use, or a collector collects. */
export const WEIGHTED_TAKE_TICKET_CONDITION = `(${NAMES.permits} > ${VALUES.gate} OR ${COLLECTOR_WAITS}) AND attribute_not_exists(${NAMES.holder})`;
export const TAKE_TICKET_UPDATE = `SET ${QUEUE_NAMES.tail} = if_not_exists(${QUEUE_NAMES.tail}, ${VALUES.zero}) + ${VALUES.one}, ${QUEUE_NAMES.head} = if_not_exists(${QUEUE_NAMES.head}, ${VALUES.zero})`;

/**
 * Wait on a ticket: write its item with the task token of this wait. The first wait needs a ticket
 * item nobody wrote (a ticket skipped while its waiter was on its way has one, marked served: the
 * waiter then takes a new ticket). A wait again, after one timed out, needs the item this execution's
 * run wrote, not served yet: a run redriven while its stopped run waited never waits on, nor is handed
 * a permit through, the ticket of the run before while that ticket waits. Once the ticket was served
 * (its item deleted), a redriven run's first wait writes the item anew and sleeps on a ticket the
 * queue has passed, renewing it at each check, until the sweep marks it passed (tidyTicket) and its
 * next wait is refused: it then takes a new ticket. No permit comes through that ticket.
 */
export const FIRST_WAIT_CONDITION = `attribute_not_exists(${QUEUE_NAMES.servedBy}) AND attribute_not_exists(${QUEUE_NAMES.waiter})`;
export const WAIT_AGAIN_CONDITION = `attribute_not_exists(${QUEUE_NAMES.servedBy}) AND ${QUEUE_NAMES.waiter} = ${QUEUE_VALUES.me} AND ${QUEUE_NAMES.run} = ${VALUES.redriveCount}`;
export const WAIT_ON_TICKET_UPDATE = `SET ${QUEUE_NAMES.waiter} = ${QUEUE_VALUES.me}, ${QUEUE_NAMES.run} = ${VALUES.redriveCount}, ${QUEUE_NAMES.lease} = ${QUEUE_VALUES.lease}, ${NAMES.limit} = ${VALUES.limit}, ${QUEUE_NAMES.token} = ${QUEUE_VALUES.token}`;

/**
 * An entry that holds a body slot and no permit (see HOLDER_PERMITS of 0, below: a rate's permit given
 * back at its interval while the body runs on): no path hands it off, and any path may remove it.
 */
const HOLDS_NO_PERMIT = `${NAMES.holder}.${HOLDER_PERMITS} = ${VALUES.zero}`;
/** The entry holds at least one permit: no HOLDER_PERMITS (one), or more than 0. */
const HOLDS_A_PERMIT = `(attribute_not_exists(${NAMES.holder}.${HOLDER_PERMITS}) OR ${NAMES.holder}.${HOLDER_PERMITS} > ${VALUES.zero})`;

/**
 * Release when nobody waits: RELEASE_STOPPED_RUN_CONDITION and no ticket waiting. Every release that
 * frees a permit checks the queue in the same write, so that a waiter that took a ticket meanwhile is
 * never left asleep beside a free permit (its ticket needed the lock full, and the lock stays full).
 * Also while a collector is short of permits (they go to it: nobody else may take them), and always for
 * the collector's own entry, which must leave through RELEASE_UPDATE (never by a hand-off) to take the
 * lock's mark with it; and always for an entry that holds no permit (HOLDS_NO_PERMIT), which frees a
 * body slot and no permit, so the queue's invariant holds whatever waits.
 */
export const RELEASE_IF_NO_WAITERS_CONDITION =
  `${RELEASE_STOPPED_RUN_CONDITION} AND (${NO_WAITERS} OR ${COLLECTOR_SHORT} OR attribute_exists(${NAMES.holder}.${HOLDER_COLLECTING}) OR ${HOLDS_NO_PERMIT})`;

/**
 * Is the permit still held (by the run)? A no-op write that fails when it is not: after a release and
 * a peek both failed (the queue emptied, then filled again, between them), it tells "given back
 * already" from "look at the queue again".
 */
export const STILL_HELD_CONDITION = RELEASE_STOPPED_RUN_CONDITION;
export const STILL_HELD_UPDATE = `SET ${NAMES.permits} = ${NAMES.permits}`;

/**
 * Claim the next ticket (UPDATED_NEW: the new head is the ticket claimed) while still holding the
 * permit to hand (an entry of no permit has none: HOLDS_NO_PERMIT), not the collector's own entry, and not while a collector is short of permits: every releaser claims a ticket of its own, so that releasers that give back
 * permits at once serve different waiters instead of racing for the same one. A releaser that
 * stops before it serves its ticket leaves that waiter asleep: the sweep marks such a ticket, and
 * its waiter takes a new one when its wait next times out.
 */
export const PEEK_CONDITION =
  `${RELEASE_STOPPED_RUN_CONDITION} AND ${QUEUE_NAMES.head} < ${QUEUE_NAMES.tail} AND attribute_not_exists(${NAMES.holder}.${HOLDER_COLLECTING}) ` +
  `AND (${NOT_COLLECTING} OR ${NAMES.permits} <= ${NAMES.collectGate}) AND ${HOLDS_A_PERMIT}`;
export const PEEK_UPDATE = `SET ${QUEUE_NAMES.head} = ${QUEUE_NAMES.head} + ${VALUES.one}`;

/**
 * Mark a ticket served: mark its item with the hand-off id (ALL_NEW: the waiter, its run, its lease and the
 * token of its current wait, which no wait can renew from now on). On a ticket without an item (its
 * waiter is still on its way, or the ticket is an orphan), the write creates it marked and without a
 * waiter: a waiter still on its way is refused and takes a new ticket, and the releaser claims the next one.
 */
export const MARK_TICKET_CONDITION = `attribute_not_exists(${QUEUE_NAMES.servedBy})`;
export const SERVE_TICKET_UPDATE = `SET ${QUEUE_NAMES.servedBy} = ${QUEUE_VALUES.servedBy}`;

/**
 * Serve a ticket whose waiter wrote its item (the common case): delete the item (ALL_OLD: the waiter,
 * its run, its lease and the token of its current wait, which no wait can renew from now on, since
 * WAIT_AGAIN_CONDITION needs the item) if it is not marked served and has a waiter, so that the write
 * that serves the ticket also tells the release it may hand off, with no Choice after it, and leaves
 * nothing to delete after the wake-up. Refused (a ticket without an item, or served already), the
 * release marks the ticket with MARK_TICKET_CONDITION, or reads it, and then looks for its waiter.
 */
export const SERVE_TICKET_CONDITION = `${MARK_TICKET_CONDITION} AND attribute_exists(${QUEUE_NAMES.waiter})`;

/**
 * Delete a ticket's item marked served (by the client's or the reconciler's queue service once its
 * waiter was woken, or by the sweep). Only the item this hand-off served: a sweep may have deleted it meanwhile.
 */
export const DELETE_SERVED_CONDITION = `${QUEUE_NAMES.servedBy} = ${QUEUE_VALUES.servedBy}`;

/**
 * Hand off: the holder entry moves from the releaser to the waiter of the ticket it claimed; the count
 * stays (less a weighted entry's HOLDER_EXTRA_PERMITS, given back: the waiter takes one). The same write draws the waiter's fencing token, so that tokens follow the order in which
 * permits are granted (UPDATED_OLD: the counter before the draw). Refused when the waiter holds a
 * permit already (it found one by polling), or the releaser's entry holds none (its permit went back at
 * the rate's interval since the peek, see HOLDS_NO_PERMIT): the releaser then claims the next ticket.
 */
export const HAND_OFF_CONDITION = `${RELEASE_STOPPED_RUN_CONDITION} AND attribute_not_exists(${QUEUE_NAMES.next}) AND ${HOLDS_A_PERMIT}`;
export const HAND_OFF_UPDATE =
  `SET ${QUEUE_NAMES.next} = ${VALUES.entry}, ${NAMES.fence} = ${NAMES.fence} + ${VALUES.one}, ` +
  `${NAMES.permits} = ${NAMES.permits} - if_not_exists(${NAMES.holder}.${HOLDER_EXTRA_PERMITS}, ${VALUES.zero}), ${TAKE_OFF_BODY} REMOVE ${NAMES.holder}`;

/**
 * Hand off one of a weighted holder's permits: as HAND_OFF, for an entry that holds more than one. The
 * waiter gets an entry of one permit (it waits in the queue, so it takes one), the releaser's entry
 * keeps the rest, and the count stays; the releaser then releases again, and hands on or gives back
 * what is left. Refused for an entry of one permit, which HAND_OFF moves as a whole.
 */
export const SPLIT_HAND_OFF_CONDITION = `${HAND_OFF_CONDITION} AND ${NAMES.holder}.${HOLDER_EXTRA_PERMITS} > ${VALUES.zero}`;
export const SPLIT_HAND_OFF_UPDATE =
  `SET ${QUEUE_NAMES.next} = ${VALUES.entry}, ${NAMES.fence} = ${NAMES.fence} + ${VALUES.one}, ` +
  `${NAMES.holder}.${HOLDER_PERMITS} = ${NAMES.holder}.${HOLDER_PERMITS} - ${VALUES.one}, ` +
  `${NAMES.holder}.${HOLDER_EXTRA_PERMITS} = ${NAMES.holder}.${HOLDER_EXTRA_PERMITS} - ${VALUES.one}`;

/**
 * Take back one permit handed off by SPLIT_HAND_OFF to a waiter that could not be woken (its token is
 * closed): as TAKE_BACK, but into the releaser's entry, which still holds the rest. Refused when the
 * waiter claimed it, or the releaser's entry is gone or was taken by a later run.
 */
export const TAKE_BACK_ONE_CONDITION = `${QUEUE_NAMES.next}.${HOLDER_HANDOFF_ID} = ${QUEUE_VALUES.handoffId} AND attribute_not_exists(${QUEUE_NAMES.next}.${HOLDER_CLAIMED}) AND attribute_exists(${NAMES.holder}.${HOLDER_PERMITS}) AND ${STAMPED_AT_MOST}`;
export const TAKE_BACK_ONE_UPDATE =
  `SET ${NAMES.holder}.${HOLDER_PERMITS} = ${NAMES.holder}.${HOLDER_PERMITS} + ${VALUES.one}, ` +
  `${NAMES.holder}.${HOLDER_EXTRA_PERMITS} = ${NAMES.holder}.${HOLDER_EXTRA_PERMITS} + ${VALUES.one} REMOVE ${QUEUE_NAMES.next}`;

/**
 * After a server error on the hand-off: did it land? Its hand-off id is unique, so the waiter's entry
 * carries it if and only if it did.
 */
export const CONFIRM_HAND_OFF_CONDITION = `${QUEUE_NAMES.next}.${HOLDER_HANDOFF_ID} = ${QUEUE_VALUES.handoffId}`;
export const CONFIRM_HAND_OFF_UPDATE = `SET ${NAMES.fence} = ${NAMES.fence}`;

/**
 * Take back a permit handed to a waiter that could not be woken (its token is closed): the entry
 * moves back to the releaser, which then hands it on. Only the very entry it wrote, in the same run
 * (the hand-off id carries the releaser's run: redriven after a wake-up that was delivered, its call
 * again hears that the token is closed, and must not take back the permit the woken waiter uses),
 * and only if the waiter has not claimed it meanwhile (CLAIM_UPDATE).
 */
export const TAKE_BACK_CONDITION = `${QUEUE_NAMES.next}.${HOLDER_HANDOFF_ID} = ${QUEUE_VALUES.handoffId} AND attribute_not_exists(${QUEUE_NAMES.next}.${HOLDER_CLAIMED}) AND attribute_not_exists(${NAMES.holder})`;
export const TAKE_BACK_UPDATE = `SET ${NAMES.holder} = ${VALUES.entry} REMOVE ${QUEUE_NAMES.next}`;

/** CLAIM_CONDITION's update: the run's stamp, a new acquire time, `claimed`, a fencing token. */
export const CLAIM_UPDATE = `SET ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder}.${HOLDER_CLAIMED} = ${QUEUE_VALUES.claimed}, ${NAMES.holder}.${HOLDER_ACQUIRED_AT} = ${VALUES.acquiredAt}, ${NAMES.holder}.${HOLDER_REDRIVE_COUNT} = ${VALUES.redriveCount}`;

/**
 * Register as the lock's collector: a weighted waiter of the queue that was handed one permit (its
 * entry holds one: no HOLDER_PERMITS) marks its entry and the lock, and sets the gate at which it can
 * complete (`:gate`: the limit less the permits it still needs). Only while nobody else collects (or
 * it did already: a retry after a write that landed). The entry is claimed for the run as CLAIM_UPDATE
 * does, so that nothing that judged an earlier run frees it, and no releaser takes it back.
 */
export const REGISTER_COLLECTOR_CONDITION =
  `(${NOT_COLLECTING} OR attribute_exists(${NAMES.holder}.${HOLDER_COLLECTING})) AND attribute_exists(${NAMES.holder}) ` +
  `AND attribute_not_exists(${NAMES.holder}.${HOLDER_PERMITS}) AND ${STAMPED_AT_MOST}`;
export const REGISTER_COLLECTOR_UPDATE =
  `SET ${NAMES.collecting} = ${VALUES.one}, ${NAMES.collectGate} = ${VALUES.gate}, ${NAMES.holder}.${HOLDER_COLLECTING} = ${VALUES.one}, ` +
  `${NAMES.holder}.${HOLDER_CLAIMED} = ${QUEUE_VALUES.claimed}, ${NAMES.holder}.${HOLDER_ACQUIRED_AT} = ${VALUES.acquiredAt}, ${NAMES.holder}.${HOLDER_REDRIVE_COUNT} = ${VALUES.redriveCount}`;

/**
 * Complete: once enough permits are free (`permitsInUse <= collectGate`), the collector takes the
 * rest (`:extra`, its weight less the one it holds) in one write, its entry then holds all `:weight`,
 * the marks go, and it draws its fencing token (UPDATED_NEW), only now that it holds them all.
 *
 * A collector whose entry is gone (a run redriven after the cleanup of its stopped run released it)
 * must start again rather than wait for ever: the condition lets a missing entry through, and the
 * update then fails on it (`#holder.p` has no map to go in: a ValidationException, "The document
 * path provided in the update expression is invalid for update"), as ACQUIRE_CONDITION does with an
 * entry that exists. Refused (ConditionalCheckFailed), it is still short: it waits and looks again.
 */
export const COMPLETE_COLLECTOR_CONDITION =
  `attribute_not_exists(${NAMES.holder}) OR (attribute_exists(${NAMES.holder}.${HOLDER_COLLECTING}) AND ${NAMES.permits} <= ${NAMES.collectGate} AND ${STAMPED_AT_MOST})`;
export const COMPLETE_COLLECTOR_UPDATE =
  `SET ${NAMES.permits} = ${NAMES.permits} + ${VALUES.extra}, ${NAMES.holder}.${HOLDER_PERMITS} = ${VALUES.weight}, ` +
  `${NAMES.holder}.${HOLDER_EXTRA_PERMITS} = ${VALUES.extra}, ${NAMES.fence} = ${NAMES.fence} + ${VALUES.one}, ` +
  `${NAMES.holder}.${HOLDER_REDRIVE_COUNT} = ${VALUES.redriveCount} REMOVE ${NAMES.collecting}, ${NAMES.collectGate}, ${NAMES.holder}.${HOLDER_COLLECTING}`;

/**
 * A client (the CLI, scripts) that waits on a lock whose executions queue registers as the lock's
 * collector, with an entry of no permit (HOLDER_PERMITS 0, HOLDER_COLLECTING, a short lease and its
 * owner): the releases then give their permits back instead of handing them on (COLLECTOR_SHORT),
 * newcomers queue behind it (COLLECTOR_WAITS), and it completes once its `:weight` are free
 * (CLIENT_COMPLETE_COLLECTOR). A client cannot sleep in the queue (it has no task token to be woken
 * by): without this it would poll beside a queue that takes every permit given back, and might never
 * get in. Only while nobody collects and the client holds nothing; `:gate` is the limit less its weight.
 * Its entry leaves through RELEASE_UPDATE, which takes the lock's mark with it, whoever releases it
 * (the client giving up, or an acquirer or the sweep reclaiming its lease once it has expired).
 */
export const CLIENT_REGISTER_COLLECTOR_CONDITION = `${NOT_COLLECTING} AND attribute_not_exists(${NAMES.holder})`;
export const CLIENT_REGISTER_COLLECTOR_UPDATE = `SET ${NAMES.collecting} = ${VALUES.one}, ${NAMES.collectGate} = ${VALUES.gate}, ${NAMES.holder} = ${VALUES.entry}`;
/** Renew the registration's lease (`:expiresAt`), while it is one. */
export const CLIENT_RENEW_COLLECTOR_CONDITION = `attribute_exists(${NAMES.holder}.${HOLDER_COLLECTING})`;
export const CLIENT_RENEW_COLLECTOR_UPDATE = `SET ${NAMES.holder}.${HOLDER_LEASE_EXPIRES_AT} = ${VALUES.expiresAt}`;
/**
 * Complete a client's collection: once `permitsInUse <= collectGate`, the lock's stored limit is
 * still at least the one the gate was set from (`:limit`) and a body slot is free where the lock records
 * a body limit, take the `:weight` permits and a body slot (as a client acquire does) in one write, with
 * a fresh acquire time and lease and a fencing token (UPDATED_NEW, with the lock's limit); the marks go.
 * Refused, the client is still short (or its registration is gone).
 */
export const CLIENT_COMPLETE_COLLECTOR_CONDITION =
  `attribute_exists(${NAMES.holder}.${HOLDER_COLLECTING}) AND ${NAMES.permits} <= ${NAMES.collectGate} ` +
  `AND (attribute_not_exists(${NAMES.limit}) OR ${NAMES.limit} >= ${VALUES.limit}) AND ${BODY_SLOT_FREE}`;
const CLIENT_COMPLETE_SET =
  `${NAMES.permits} = ${NAMES.permits} + ${VALUES.weight}, ${NAMES.fence} = if_not_exists(${NAMES.fence}, ${VALUES.zero}) + ${VALUES.one}, ` +
  `${NAMES.limit} = if_not_exists(${NAMES.limit}, ${VALUES.limit}), ` +
  `${NAMES.holder}.${HOLDER_ACQUIRED_AT} = ${VALUES.acquiredAt}, ${NAMES.holder}.${HOLDER_LEASE_EXPIRES_AT} = ${VALUES.expiresAt}, ` +
  `${NAMES.holder}.${HOLDER_IN_BODY} = ${VALUES.one}, ${COUNT_BODY}`;
const CLIENT_COMPLETE_REMOVE = `${NAMES.collecting}, ${NAMES.collectGate}, ${NAMES.holder}.${HOLDER_COLLECTING}`;
/** One permit: the entry's HOLDER_PERMITS goes (an entry without it holds one). */
export const CLIENT_COMPLETE_COLLECTOR_UPDATE = `SET ${CLIENT_COMPLETE_SET} REMOVE ${CLIENT_COMPLETE_REMOVE}, ${NAMES.holder}.${HOLDER_PERMITS}`;
/** Several: the entry records them (HOLDER_PERMITS, and `:extra`, the weight less one), as a weighted acquire's. */
export const CLIENT_WEIGHTED_COMPLETE_COLLECTOR_UPDATE =
  `SET ${CLIENT_COMPLETE_SET}, ${NAMES.holder}.${HOLDER_PERMITS} = ${VALUES.weight}, ${NAMES.holder}.${HOLDER_EXTRA_PERMITS} = ${VALUES.extra} ` +
  `REMOVE ${CLIENT_COMPLETE_REMOVE}`;

/**
 * Claim an entry of one permit (a weighted waiter of the queue finds the permit handed to it without
 * being woken): as CLAIM_CONDITION, for an entry that holds one. The waiter then registers as the
 * collector.
 */
export const CLAIM_HANDED_CONDITION = `${CLAIM_CONDITION} AND attribute_not_exists(${NAMES.holder}.${HOLDER_PERMITS})`;

/**
 * Give back the one permit a weighted waiter of the queue was handed, when another execution collects
 * already (REGISTER_COLLECTOR refused): the waiter then takes a new ticket. Two collectors at once could
 * deadlock (each holding part of what the other needs), so the one that came second loses its place.
 */
export const GIVE_UP_HANDED_CONDITION = `${RELEASE_STOPPED_RUN_CONDITION} AND attribute_not_exists(${NAMES.holder}.${HOLDER_PERMITS})`;

/**
 * Take a body slot (see BODIES_RUNNING) for the holder's permit: while fewer than `:bodyLimit` bodies
 * run, mark the entry and count it, and record the limit for clients. It is also a claim (CLAIM_UPDATE):
 * the entry gets the run's stamp and a new acquire time (a run redriven after its acquire, before its
 * body, takes its slot here, outside the body, where the redrive guard leaves it to the workflow), and
 * the body's fencing token is drawn here, so that tokens follow the order in which bodies are let in.
 * A holder without an entry (freed while its execution was stopped, or by an expired lease) passes the
 * condition and fails the update (`#holder.b` has no map to go in: a ValidationException), as
 * COMPLETE_COLLECTOR does: it acquires again. Refused (ConditionalCheckFailed) when the slots are all
 * taken, or when the entry holds one already (a write whose response was lost, a redrive):
 * BODY_SLOT_HELD tells which.
 */
export const TAKE_BODY_SLOT_CONDITION =
  `attribute_not_exists(${NAMES.holder}) OR (attribute_not_exists(${NAMES.holder}.${HOLDER_IN_BODY}) AND ${STAMPED_AT_MOST} AND ` +
  `(attribute_not_exists(${NAMES.bodies}) OR ${NAMES.bodies} < ${VALUES.bodyLimit}))`;
export const TAKE_BODY_SLOT_UPDATE =
  `${CLAIM_UPDATE}, ${COUNT_BODY}, ${NAMES.holder}.${HOLDER_IN_BODY} = ${VALUES.one}, ` +
  `${NAMES.bodyLimit} = ${VALUES.bodyLimit}`;

/** Claim (CLAIM_UPDATE) an entry of this run or an earlier one that holds a body slot already; refused when it holds none. */
export const BODY_SLOT_HELD_CONDITION = `attribute_exists(${NAMES.holder}.${HOLDER_IN_BODY}) AND ${STAMPED_AT_MOST}`;

/**
 * The redrive guard's claim of an entry without a body slot, for a run resumed inside its body (an
 * entry handed to it by a stale ticket, or taken back after a lost wake-up): as CLAIM_UPDATE, and it
 * takes a slot in the same write, while one is free under the lock's recorded BODY_LIMIT (if any).
 */
export const CLAIM_WITH_BODY_SLOT_CONDITION =
  `attribute_exists(${NAMES.holder}) AND attribute_not_exists(${NAMES.holder}.${HOLDER_IN_BODY}) AND ${STAMPED_AT_MOST} AND ${BODY_SLOT_FREE}`;
export const CLAIM_WITH_BODY_SLOT_UPDATE = `${CLAIM_UPDATE}, ${COUNT_BODY}, ${NAMES.holder}.${HOLDER_IN_BODY} = ${VALUES.one}`;

/**
 * Give back the body slot once the body ended, keeping the permit (the rate holds it for the rest of
 * the interval). Refused when the entry holds no slot (given back already, or the entry released).
 */
export const RELEASE_BODY_SLOT_CONDITION = `attribute_exists(${NAMES.holder}.${HOLDER_IN_BODY})`;
export const RELEASE_BODY_SLOT_UPDATE = `SET ${NAMES.bodies} = ${NAMES.bodies} - ${VALUES.one} REMOVE ${NAMES.holder}.${HOLDER_IN_BODY}`;

/**
 * ACQUIRE of a permit and a body slot in one write (the redrive guard's, for a run resumed inside the
 * user's body): as ACQUIRE_CONDITION, with a free slot too when the lock records a BODY_LIMIT (as a
 * client's acquire, below); the entry it writes carries HOLDER_IN_BODY.
 */
export const ACQUIRE_WITH_BODY_SLOT_CONDITION =
  `attribute_not_exists(${NAMES.permits}) OR (${NAMES.permits} < ${VALUES.limit} AND ${NOT_COLLECTING} AND ` +
  `${BODY_SLOT_FREE}) OR attribute_exists(${NAMES.holder})`;
export const ACQUIRE_WITH_BODY_SLOT_UPDATE = `${ACQUIRE_UPDATE}, ${COUNT_BODY}`;

/**
 * A client's acquire also takes a body slot when the lock records a BODY_LIMIT (it keeps it until it
 * releases): the condition CLIENT_ACQUIRE_CONDITION is joined with this, and the update with
 * CLIENT_BODY_SLOT_UPDATE; the entry carries HOLDER_IN_BODY.
 */
export const CLIENT_BODY_SLOT_CONDITION = BODY_SLOT_FREE;
export const CLIENT_BODY_SLOT_UPDATE = COUNT_BODY;

/*
 * A concurrency limit above the rate's count (docs/design-rates-and-weights.md, "A concurrency limit
 * above the rate's count"): the rate's permit goes back at the interval, as with a rate alone, while the
 * body keeps its slot until both it and the interval have ended. The entry stays, with HOLDER_PERMITS 0 and its HOLDER_IN_BODY mark,
 * so that every release path (the cleanup, the sweep, force-release) still finds the slot to free: they
 * remove it with RELEASE_UPDATE (which gives back its 0 permits), whatever waits (RELEASE_IF_NO_WAITERS),
 * and never hand it off (PEEK refuses it). The release at the interval uses the writes below.
 */

/**
 * Give the rate's permit back at the interval and keep the body slot: the entry of this run (or an
 * earlier one), holding one permit and a slot, while nobody waits (a waiter would sleep beside the
 * freed permit), or while a collector is short of permits (as RELEASE_IF_NO_WAITERS: they go to it). Refused, the release hands the permit to the next waiter (KEEP_SLOT_HAND_OFF), or, for
 * an entry without a slot, releases as a rate alone does, with the conditions OUTSIDE_BODY.
 */
export const KEEP_SLOT_RELEASE_CONDITION =
  `${RELEASE_STOPPED_RUN_CONDITION} AND attribute_exists(${NAMES.holder}.${HOLDER_IN_BODY}) AND ` +
  `attribute_not_exists(${NAMES.holder}.${HOLDER_PERMITS}) AND (${NO_WAITERS} OR ${COLLECTOR_SHORT})`;
export const KEEP_SLOT_RELEASE_UPDATE = `SET ${NAMES.permits} = ${NAMES.permits} - ${VALUES.one}, ${NAMES.holder}.${HOLDER_PERMITS} = ${VALUES.zero}`;

/**
 * The release at the interval, for an entry without a slot: the give-back and the hand-off of a whole
 * entry, refused while the entry holds a slot (moving or removing it would take the slot from a body
 * that may run on). The slot goes only after this release has ended, so the entry lacks one only when
 * TAKE_BACK moved a waiter's entry to the releaser (its own was removed meanwhile: a `force-release`).
 */
export const OUTSIDE_BODY = `attribute_not_exists(${NAMES.holder}.${HOLDER_IN_BODY})`;

/**
 * Hand the rate's permit to the waiter of the ticket claimed, keeping the body slot: as HAND_OFF, but the
 * releaser's entry stays, with no permit (the count stays: the permit moves). Refused for an entry
 * without a slot (the whole entry then moves, HAND_OFF with OUTSIDE_BODY), or when the waiter holds a
 * permit already.
 */
export const KEEP_SLOT_HAND_OFF_CONDITION =
  `${HAND_OFF_CONDITION} AND attribute_exists(${NAMES.holder}.${HOLDER_IN_BODY}) AND attribute_not_exists(${NAMES.holder}.${HOLDER_PERMITS})`;
export const KEEP_SLOT_HAND_OFF_UPDATE =
  `SET ${QUEUE_NAMES.next} = ${VALUES.entry}, ${NAMES.fence} = ${NAMES.fence} + ${VALUES.one}, ${NAMES.holder}.${HOLDER_PERMITS} = ${VALUES.zero}`;

/**
 * Take back a permit handed off by KEEP_SLOT_HAND_OFF to a waiter that could not be woken: into the
 * releaser's entry of no permit, which holds one again. Refused when the waiter claimed it, or the
 * releaser's entry is gone (a `force-release`, an expired lease), when TAKE_BACK moves the waiter's entry
 * to the releaser as a whole.
 */
export const TAKE_BACK_INTO_SLOT_CONDITION =
  `${QUEUE_NAMES.next}.${HOLDER_HANDOFF_ID} = ${QUEUE_VALUES.handoffId} AND attribute_not_exists(${QUEUE_NAMES.next}.${HOLDER_CLAIMED}) ` +
  `AND ${HOLDS_NO_PERMIT} AND ${STAMPED_AT_MOST}`;
export const TAKE_BACK_INTO_SLOT_UPDATE = `REMOVE ${QUEUE_NAMES.next}, ${NAMES.holder}.${HOLDER_PERMITS}`;

/** STILL_HELD for the release at the interval: the entry holds a permit (not only a slot). */
export const STILL_HOLDS_PERMIT_CONDITION = `${STILL_HELD_CONDITION} AND ${HOLDS_A_PERMIT}`;

/**
 * Once the body and the release at the interval have both ended (after the Parallel), an entry of no
 * permit goes with its slot in one write. Refused, the entry still holds its permit (the release at the
 * interval failed, or the run was redriven): RELEASE_BODY_SLOT gives back the slot only.
 */
export const RELEASE_BODY_SLOT_AND_ENTRY_CONDITION = `attribute_exists(${NAMES.holder}.${HOLDER_IN_BODY}) AND ${HOLDS_NO_PERMIT}`;
export const RELEASE_BODY_SLOT_AND_ENTRY_UPDATE = `SET ${NAMES.bodies} = ${NAMES.bodies} - ${VALUES.one} REMOVE ${NAMES.holder}`;

/**
 * The redrive guard's claim of an entry that holds a body slot (BODY_SLOT_HELD) and a permit. A run
 * redriven in its body after its interval finds an entry of no permit instead: it takes a permit into
 * it (RETAKE_PERMIT_IN_SLOT), since a redrive counts as an acquisition.
 */
export const BODY_SLOT_AND_PERMIT_HELD_CONDITION = `${BODY_SLOT_HELD_CONDITION} AND ${HOLDS_A_PERMIT}`;

/**
 * The redrive guard's take of a permit into the entry of no permit that keeps its body slot (the run
 * before gave its permit back at the interval, then was stopped in its body): while a permit is free
 * (as ACQUIRE_CONDITION: `permitsInUse < :limit` and nobody collects), in one write that counts the
 * permit, draws a fencing token and claims the entry for the run (CLAIM_UPDATE). The slot stays where
 * it is, so no other execution can take it in between. Refused while every permit is taken.
 */
export const RETAKE_PERMIT_IN_SLOT_CONDITION =
  `attribute_exists(${NAMES.holder}.${HOLDER_IN_BODY}) AND ${HOLDS_NO_PERMIT} AND ${STAMPED_AT_MOST} AND ` +
  `${NAMES.permits} < ${VALUES.limit} AND ${NOT_COLLECTING}`;
export const RETAKE_PERMIT_IN_SLOT_UPDATE = `${CLAIM_UPDATE}, ${NAMES.permits} = ${NAMES.permits} + ${VALUES.one} REMOVE ${NAMES.holder}.${HOLDER_PERMITS}`;
