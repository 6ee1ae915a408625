/**
 * The idempotency record schema: one DynamoDB item per idempotency key, written only by the states in
 * idempotency-states.ts.
 *
 *   id           (S, partition key)  `<workflow prefix>#<sha-256 of the selected input>`
 *   status       (S)                 IN_PROGRESS, SUCCEEDED or FAILED
 *   owner        (S)                 ARN of the execution that wrote the record
 *   expiresAt    (N)                 epoch seconds: the table's TTL attribute
 *   expiresAtIso (S)                 the same instant, ISO-8601; the workflows compare it with
 *                                    `$$.State.EnteredTime` (strings in one format compare in time
 *                                    order), because TTL deletes expired items only within days
 *   validation   (S)                 SHA-256 of the validated fields, or `-`
 *   result       (S)                 SUCCEEDED only: the execution's output as JSON text
 */

export const RECORD_KEY = 'id';
export const RECORD_STATUS = 'status';
export const RECORD_OWNER = 'owner';
export const RECORD_EXPIRES_AT = 'expiresAt';
export const RECORD_EXPIRES_AT_ISO = 'expiresAtIso';
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
  expiresAtIso: '#expiresAtIso',
  validation: '#validation',
  result: '#result',
} as const;

export const RECORD_VALUES = {
  inProgress: ':inProgress',
  succeeded: ':succeeded',
  failed: ':failed',
  me: ':me',
  now: ':now',
  deadOwner: ':deadOwner',
  expiresAt: ':expiresAt',
  expiresAtIso: ':expiresAtIso',
  validation: ':validation',
  result: ':result',
} as const;

const N = RECORD_NAMES;
const V = RECORD_VALUES;

/**
 * Claim a key: there is no record, or its execution failed, or it expired, or this execution already
 * claimed it (so that retrying a claim whose first attempt landed succeeds).
 */
export const CLAIM_CONDITION = `attribute_not_exists(${N.status}) OR ${N.status} = ${V.failed} OR ${N.expiresAtIso} < ${V.now} OR ${N.owner} = ${V.me}`;

/** Take over the record of an execution that is no longer running, if it still holds it. */
export const TAKE_OVER_CONDITION = `${N.owner} = ${V.deadOwner} AND ${N.status} = ${V.inProgress}`;

/** What a claim (or a take-over) writes. */
export const CLAIM_UPDATE = `SET ${N.status} = ${V.inProgress}, ${N.owner} = ${V.me}, ${N.expiresAt} = ${V.expiresAt}, ${N.expiresAtIso} = ${V.expiresAtIso}, ${N.validation} = ${V.validation} REMOVE ${N.result}`;

/** Only the owner of an IN_PROGRESS record completes it. */
export const COMPLETE_CONDITION = `${N.owner} = ${V.me} AND ${N.status} = ${V.inProgress}`;

export const SUCCEED_UPDATE = `SET ${N.status} = ${V.succeeded}, ${N.result} = ${V.result}`;
export const FAIL_UPDATE = `SET ${N.status} = ${V.failed}`;
