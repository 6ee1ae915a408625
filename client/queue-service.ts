import { AttributeValue } from '@aws-sdk/client-dynamodb';
import { clock, dynamodb, errorName, Flow, stepFunctions } from './effects';
import {
  CONCURRENCY_LIMIT,
  FENCING_TOKEN,
  HOLDER_ACQUIRED_AT,
  HOLDER_CLAIMED,
  HOLDER_FENCING_TOKEN,
  HOLDER_LEASE_SECONDS,
  HOLDER_REDRIVE_COUNT,
  LOCK_KEY,
  MAX_WAITERS,
  PERMITS_IN_USE,
  WAITER_ID,
  WAITERS,
  waitTokenAttribute,
} from '../src/private/lock-schema';

/*
 * Serving a lock's queue from outside the state machines: the reconciler's sweep and the client after
 * it reclaimed expired leases. The workflows hand a permit to the oldest waiter whenever they give one
 * back; a permit freed any other way (an expired lease, a dead holder swept, an acquire claimed after
 * a server error) would sit free while waiters sleep until their check interval. This gives every
 * free permit to the head of the queue, as a release would, and tidies the queue on the way:
 *
 * - an entry of a waiter that already holds a permit (it found one by polling) is dropped;
 * - an entry of a waiter that is gone (`isGone`: its execution stopped, or a later run of it runs) is dropped;
 * - a second entry of one run of a waiter (which the enqueue's condition prevents) is dropped.
 *
 * Every write is conditional on what was read (the entry at that index with that id, its token, the
 * count and fencing counter unchanged), so it is safe beside workflows that enqueue, release and hand off.
 */

/** The errors of SendTaskSuccess for a token whose task no longer waits. */
const TOKEN_GONE = ['TaskTimedOut', 'TaskDoesNotExist', 'InvalidToken'];

export interface QueueServiceOptions {
  readonly tableName: string;
  /**
   * Whether a waiter can never be woken: its execution stopped, or runs a later run than the one
   * that queued. @default - never asked: such entries are left to the releasers
   */
  readonly isGone?: (executionArn: string, run: number) => Flow<boolean>;
  /** Told when a waiter was handed a permit but SendTaskSuccess failed for another reason than a closed token. @default - not told */
  readonly onWakeUpLost?: (executionArn: string, error: Error) => void;
}

/** What serving a queue did. */
export interface QueueServiceResult {
  /** Entries dropped or merged: stale, duplicate or of a stopped waiter. */
  removed: number;
  /** Waiters handed a free permit and woken. */
  admitted: number;
}

/** Give the lock's free permits to its oldest waiters and drop entries that can never be served. */
export function* serveQueue(options: QueueServiceOptions, lockName: string): Flow<QueueServiceResult> {
  const result: QueueServiceResult = { removed: 0, admitted: 0 };
  const gone = new Map<string, boolean>();
  const isGone = function* (id: string, run: number): Flow<boolean> {
    if (!options.isGone) return false;
    const key = `${run}:${id}`;
    if (!gone.has(key)) gone.set(key, yield* options.isGone(id, run));
    return gone.get(key)!;
  };
  const update = (expression: string, condition: string, names: Record<string, string>, values: Record<string, AttributeValue>) =>
    conditionalUpdate(options, lockName, expression, condition, names, values);

  // Each round changes the item once (or stops); a bound keeps a queue that keeps changing from holding it forever.
  for (let round = 0; round < 3 * MAX_WAITERS; round++) {
    const item: Record<string, AttributeValue> | undefined = (
      yield* dynamodb('GetItem', { TableName: options.tableName, Key: { [LOCK_KEY]: { S: lockName } }, ConsistentRead: true })
    ).Item;
    const waiters = (item?.[WAITERS]?.L ?? []).map((w) => {
      const id = w.M?.[WAITER_ID]?.S ?? '';
      const run = w.M?.[HOLDER_REDRIVE_COUNT]?.N ?? '0';
      return { id, run, token: item?.[waitTokenAttribute(id, run)]?.S, entry: w.M ?? {} };
    });
    if (!item || waiters.length === 0) break;

    const tidied = yield* tidy(item, waiters, isGone, update);
    if (tidied === 'changed') {
      result.removed++;
      continue;
    }
    if (tidied === 'conflict') continue;

    const permits = Number(item[PERMITS_IN_USE]?.N ?? '0');
    const head = waiters[0];
    // Below the lock's limit and the waiter's own (limits read from the input differ per execution).
    const limits = [item[CONCURRENCY_LIMIT]?.N, head.entry[CONCURRENCY_LIMIT]?.N].filter((n): n is string => n !== undefined).map(Number);
    if (limits.length === 0 || permits >= Math.min(...limits)) break;
    const fence = Number(item[FENCING_TOKEN]?.N ?? '0') + 1;
    if (head.token === undefined) break; // tidy() leaves no entry without a token at the head
    const now = yield* clock();
    const admitted = yield* update(
      'SET #permits = :permitsAfter, #fence = :fence, #head = :entry REMOVE #waiters[0], #token',
      `#permits = :permits AND ${item[FENCING_TOKEN] ? '#fence = :fenceBefore' : 'attribute_not_exists(#fence)'} AND #waiters[0].#id = :id AND #token = :token AND attribute_not_exists(#head)`,
      { '#permits': PERMITS_IN_USE, '#fence': FENCING_TOKEN, '#head': head.id, '#waiters': WAITERS, '#id': WAITER_ID, '#token': waitTokenAttribute(head.id, head.run) },
      {
        ':permits': { N: String(permits) },
        ':permitsAfter': { N: String(permits + 1) },
        ':fence': { N: String(fence) },
        ...(item[FENCING_TOKEN] ? { ':fenceBefore': { N: String(fence - 1) } } : {}),
        ':id': { S: head.id },
        ':token': { S: head.token },
        ':entry': {
          M: {
            [HOLDER_ACQUIRED_AT]: { S: new Date(now).toISOString() },
            [HOLDER_REDRIVE_COUNT]: { N: head.run },
            [HOLDER_LEASE_SECONDS]: { N: head.entry[HOLDER_LEASE_SECONDS]?.N ?? '0' },
            [HOLDER_FENCING_TOKEN]: { N: String(fence) },
          },
        },
      },
    );
    if (!admitted) continue;
    try {
      yield* stepFunctions('SendTaskSuccess', { taskToken: head.token, output: JSON.stringify({ fencingToken: fence }) });
      result.admitted++;
    } catch (e) {
      // Not delivered for another reason: the waiter finds its permit when its wait times out.
      if (!TOKEN_GONE.includes(errorName(e))) {
        options.onWakeUpLost?.(head.id, e as Error);
        break;
      }
      // Its task is gone: give the permit back, unless the waiter found and claimed it meanwhile.
      yield* update(
        'SET #permits = #permits - :one REMOVE #head',
        '#head.#fencingToken = :fence AND attribute_not_exists(#head.#claimed)',
        { '#permits': PERMITS_IN_USE, '#head': head.id, '#fencingToken': HOLDER_FENCING_TOKEN, '#claimed': HOLDER_CLAIMED },
        { ':one': { N: '1' }, ':fence': { N: String(fence) } },
      );
    }
  }
  return result;
}

type Update = (expression: string, condition: string, names: Record<string, string>, values: Record<string, AttributeValue>) => Flow<boolean>;

/** Make at most one change to the queue: 'changed', 'conflict' (the item changed meanwhile), or 'clean'. */
function* tidy(
  item: Record<string, AttributeValue>,
  waiters: Array<{ id: string; run: string; token?: string }>,
  isGone: (id: string, run: number) => Flow<boolean>,
  update: Update,
): Flow<'changed' | 'conflict' | 'clean'> {
  const seen = new Set<string>();
  for (let i = 0; i < waiters.length; i++) {
    const { id, run, token } = waiters[i];
    const names = { '#waiters': WAITERS, '#id': WAITER_ID };
    const values = { ':id': { S: id } };
    if (seen.has(`${run}:${id}`)) {
      // Its token belongs to its first entry: only this one goes.
      return outcome(yield* update(`REMOVE #waiters[${i}]`, `#waiters[${i}].#id = :id`, names, values));
    }
    seen.add(`${run}:${id}`);
    const holds = item[id]?.M?.[HOLDER_ACQUIRED_AT] !== undefined;
    if (holds || token === undefined || (yield* isGone(id, Number(run)))) {
      // The entry and its token go together, the token as read (a waiter that renewed it meanwhile stays).
      const tokenIs = token === undefined ? 'attribute_not_exists(#token)' : '#token = :token';
      return outcome(
        yield* update(`REMOVE #waiters[${i}]${token === undefined ? '' : ', #token'}`, `#waiters[${i}].#id = :id AND ${tokenIs}`, { ...names, '#token': waitTokenAttribute(id, run) }, {
          ...values,
          ...(token === undefined ? {} : { ':token': { S: token } }),
        }),
      );
    }
  }
  return 'clean';
}

function outcome(changed: boolean): 'changed' | 'conflict' {
  return changed ? 'changed' : 'conflict';
}

function* conditionalUpdate(
  options: QueueServiceOptions,
  lockName: string,
  expression: string,
  condition: string,
  names: Record<string, string>,
  values: Record<string, AttributeValue>,
): Flow<boolean> {
  try {
    yield* dynamodb('UpdateItem', {
      TableName: options.tableName,
      Key: { [LOCK_KEY]: { S: lockName } },
      UpdateExpression: expression,
      ConditionExpression: condition,
      ExpressionAttributeNames: names,
      ExpressionAttributeValues: values,
    });
    return true;
  } catch (e) {
    if (errorName(e) === 'ConditionalCheckFailedException') return false;
    throw e;
  }
}
