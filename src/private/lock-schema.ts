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
 * Acquire: one conditional write both checks and takes a permit. `<` rather than `<>`, so that a lowered
 * limit never opens the gate; `attribute_not_exists(holder)` so that one holder never counts twice.
 */
export const ACQUIRE_CONDITION = `(attribute_not_exists(${NAMES.permits}) OR ${NAMES.permits} < ${VALUES.limit}) AND attribute_not_exists(${NAMES.holder})`;
export const ACQUIRE_UPDATE = `SET ${NAMES.permits} = if_not_exists(${NAMES.permits}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder} = ${VALUES.entry}, ${NAMES.limit} = ${VALUES.limit}`;

/**
 * Acquire by a client (the CLI, scripts): as ACQUIRE_CONDITION, and also below the limit stored on the
 * item, so that a client's limit can lower the gate but never raise it above the workflows' (the
 * effective limit is the smaller of the two). The update records the client's limit only on a lock
 * that has none yet; workflows keep writing theirs on every acquire.
 */
export const CLIENT_ACQUIRE_CONDITION = `(attribute_not_exists(${NAMES.permits}) OR (${NAMES.permits} < ${VALUES.limit} AND (attribute_not_exists(${NAMES.limit}) OR ${NAMES.permits} < ${NAMES.limit}))) AND attribute_not_exists(${NAMES.holder})`;
export const CLIENT_ACQUIRE_UPDATE = `SET ${NAMES.permits} = if_not_exists(${NAMES.permits}, ${VALUES.zero}) + ${VALUES.one}, ${NAMES.holder} = ${VALUES.entry}, ${NAMES.limit} = if_not_exists(${NAMES.limit}, ${VALUES.limit})`;

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

/**
 * Release by the cleanup of a stopped run: as RELEASE_CONDITION, and only if the permit was taken by
 * that run or an earlier one. A status event delivered late (or twice) after the execution was
 * redriven must not free the permit its new run took.
 */
export const RELEASE_STOPPED_RUN_CONDITION = `attribute_exists(${NAMES.holder}) AND (attribute_not_exists(${NAMES.holder}.${HOLDER_REDRIVE_COUNT}) OR ${NAMES.holder}.${HOLDER_REDRIVE_COUNT} <= ${VALUES.redriveCount})`;

/**
 * Release by a sweep of a holder it judged dead: as RELEASE_CONDITION, and only if the entry is still
 * the one it read. A redriven execution keeps its ARN; once it holds a permit again (a new entry), a
 * sweep that read the old one must not free it.
 */
export const RELEASE_SEEN_HOLDER_CONDITION = `attribute_exists(${NAMES.holder}) AND ${NAMES.holder}.${HOLDER_ACQUIRED_AT} = ${VALUES.acquiredAt}`;

/**
 * Release of an entry taken before a given time (ISO-8601 strings compare in time order): the redrive
 * guard frees what an execution redriven before the body left from its previous run.
 */
export const RELEASE_TAKEN_BEFORE_CONDITION = `attribute_exists(${NAMES.holder}) AND ${NAMES.holder}.${HOLDER_ACQUIRED_AT} < ${VALUES.acquiredAt}`;

/**
 * Renewal of a holder entry it still has (the redrive guard): a new acquire time and run, so that a
 * sweep that read the entry before the redrive, or the late cleanup of the run before it, leaves it alone. Conditional on RELEASE_CONDITION.
 */
export const RENEW_UPDATE = `SET ${NAMES.holder}.${HOLDER_ACQUIRED_AT} = ${VALUES.acquiredAt}, ${NAMES.holder}.${HOLDER_REDRIVE_COUNT} = ${VALUES.redriveCount}`;

/** Longest lock name we accept; far below DynamoDB's 2,048-byte partition key limit. */
export const MAX_LOCK_NAME_LENGTH = 255;
