/**
 * The idempotency record schema: one DynamoDB item per idempotency key, written only by the states in
 * idempotency-states.ts.
 *
 *   id           (S, partition key)  `<workflow prefix>#<sha-256 of the selected input>`
 *   status       (S)                 IN_PROGRESS, SUCCEEDED or FAILED
 *   owner        (S)                 ARN of the execution that wrote the record
 *   expiresAt    (N)                 epoch seconds: the table's TTL attribute, which only cleans up.
 *                                    A year and a day ahead while IN_PROGRESS (DynamoDB must never
 *                                    delete the record of a running execution); once completed, the
 *                                    start plus `expiresAfter` plus a week
 *   completedAt  (S)                 when the record was completed, ISO-8601 (`$$.State.EnteredTime`).
 *                                    A claim compares it with its own start minus `expiresAfter`
 *                                    (strings in one format compare in time order): expiry is checked
 *                                    by timestamp and counted from completion, as TTL can lag by days
 *   validation   (S)                 SHA-256 of the validated fields, or `-`
 *   result       (S)                 SUCCEEDED only: the execution's output as JSON text
 */

export const RECORD_KEY = 'id';
export const RECORD_STATUS = 'status';
export const RECORD_OWNER = 'owner';
export const RECORD_EXPIRES_AT = 'expiresAt';
export const RECORD_COMPLETED_AT = 'completedAt';
export const RECORD_VALIDATION = 'validation';
export const RECORD_RESULT = 'result';

export const STATUS = {
  inProgress: 'IN_PROGRESS',
  succeeded: 'SUCCEEDED',
  failed: 'FAILED',
} as const;

export const RECORD_NAMES = {
  status: '#status',
  owner: '#owner',
  expiresAt: '#expiresAt',
  completedAt: '#completedAt',
  validation: '#validation',
  result: '#result',
} as const;

export const RECORD_VALUES = {
  inProgress: ':inProgress',
  succeeded: ':succeeded',
  failed: ':failed',
  me: ':me',
  deadOwner: ':deadOwner',
  expiresAt: ':expiresAt',
  notBefore: ':notBefore',
  inProgressExpiresAt: ':inProgressExpiresAt',
  validation: ':validation',
  result: ':result',
  completedAt: ':completedAt',
} as const;

const N = RECORD_NAMES;
const V = RECORD_VALUES;

/**
 * Claim a key: there is no record, or its execution failed, or it succeeded and has expired, or this
 * execution already claimed it (so that retrying a claim whose first attempt landed succeeds). An
 * IN_PROGRESS record is never claimed by time: only a take-over, once its execution is known to be
 * gone, replaces it.
 */
export const CLAIM_CONDITION = `attribute_not_exists(${N.status}) OR ${N.status} = ${V.failed} OR (${N.status} = ${V.succeeded} AND ${N.completedAt} < ${V.notBefore}) OR ${N.owner} = ${V.me}`;

/** Take over the record of an execution that is no longer running, if it still holds it. */
export const TAKE_OVER_CONDITION = `${N.owner} = ${V.deadOwner} AND ${N.status} = ${V.inProgress}`;

/** What a claim (or a take-over) writes. */
export const CLAIM_UPDATE = `SET ${N.status} = ${V.inProgress}, ${N.owner} = ${V.me}, ${N.expiresAt} = ${V.inProgressExpiresAt}, ${N.validation} = ${V.validation} REMOVE ${N.result}, ${N.completedAt}`;

/** Only the owner of an IN_PROGRESS record completes it. */
export const COMPLETE_CONDITION = `${N.owner} = ${V.me} AND ${N.status} = ${V.inProgress}`;

/** Completing sets the TTL to the record's expiry. */
export const SUCCEED_UPDATE = `SET ${N.status} = ${V.succeeded}, ${N.result} = ${V.result}, ${N.expiresAt} = ${V.expiresAt}, ${N.completedAt} = ${V.completedAt}`;
export const FAIL_UPDATE = `SET ${N.status} = ${V.failed}, ${N.expiresAt} = ${V.expiresAt}, ${N.completedAt} = ${V.completedAt}`;
