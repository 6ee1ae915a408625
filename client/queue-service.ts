import { AttributeValue } from '@aws-sdk/client-dynamodb';
import { clock, dynamodb, errorName, Flow, stepFunctions, uuid } from './effects';
import { deleteServedTicket, readTicket, serveTicket, waitingTickets } from './ticket-queue';
import {
  COLLECT_GATE,
  COLLECTING,
  CONCURRENCY_LIMIT,
  FENCING_TOKEN,
  HOLDER_ACQUIRED_AT,
  HOLDER_CLAIMED,
  HOLDER_FENCING_TOKEN,
  HOLDER_LEASE_SECONDS,
  HOLDER_REDRIVE_COUNT,
  LOCK_KEY,
  PERMITS_IN_USE,
  QUEUE_HEAD,
  TICKET_SERVED_BY,
  TICKET_WAIT_TOKEN,
  TICKET_WAITER,
  NAMES,
  NOT_COLLECTING,
  VALUES,
} from '../src/private/lock-schema';

/*
 * Serving a lock's queue from outside the state machines: the reconciler's sweep and the client after
 * it reclaimed expired leases. The workflows hand a permit to the next waiter whenever they give one
 * back; a permit freed any other way (an expired lease, a dead holder swept, an acquire claimed after
 * a server error) would sit free while waiters sleep until their check interval. This gives every
 * free permit to the waiter whose turn it is, as a release would, and passes on the way the tickets
 * that can never be served:
 *
 * - a ticket without a waiter (skipped: its waiter was on its way, or it is an orphan);
 * - a ticket whose waiter already holds a permit (it found one by polling);
 * - a ticket whose waiter is gone (`isGone`: its execution stopped, or a later run of it runs).
 *
 * Every write on the lock item is conditional on what was read (the ticket passed so far, the count
 * and fencing counter unchanged), so it is safe beside workflows that take tickets, release and hand off.
 */

/** Pass the ticket after `:head` (a compare-and-set: releasers claim tickets by adding one to the head). */
const PASS_TICKET_UPDATE = 'SET #head = :nextTicket';
const PASS_TICKET_CONDITION = '#head = :head';
/** The same, for a ticket whose waiter holds a permit already. */
const DROP_TICKET_CONDITION = '#head = :head AND attribute_exists(#next)';

/** The errors of SendTaskSuccess for a token whose task no longer waits. */
const TOKEN_GONE = ['TaskTimedOut', 'TaskDoesNotExist', 'InvalidToken'];

/** Rounds of one serving: each passes a ticket, admits a waiter, or stops. */
const MAX_ROUNDS = 200;

export interface QueueServiceOptions {
  readonly tableName: string;
  /**
   * Whether a waiter (its holder id) can never be woken: its execution stopped, or runs a later run than the one
   * that queued. @default - never asked: such tickets are left to the releasers
   */
  readonly isGone?: (waiter: string, run: number) => Flow<boolean>;
  /** Told when a waiter was handed a permit but SendTaskSuccess failed for another reason than a closed token. @default - not told */
  readonly onWakeUpLost?: (waiter: string, error: Error) => void;
}

/** What serving a queue did. */
export interface QueueServiceResult {
  /** Tickets passed without a permit: skipped, of a waiter holding one already, or of a waiter that is gone. */
  removed: number;
  /** Waiters handed a free permit and woken. */
  admitted: number;
}

/** Give the lock's free permits to the waiters whose turn it is, and pass the tickets that can never be served. */
export function* serveQueue(options: QueueServiceOptions, lockName: string): Flow<QueueServiceResult> {
  const result: QueueServiceResult = { removed: 0, admitted: 0 };
  const update = (expression: string, condition: string, names: Record<string, string>, values: Record<string, AttributeValue>) =>
    conditionalUpdate(options, lockName, expression, condition, names, values);

  for (let round = 0; round < MAX_ROUNDS; round++) {
    const item: Record<string, AttributeValue> | undefined = (
      yield* dynamodb('GetItem', { TableName: options.tableName, Key: { [LOCK_KEY]: { S: lockName } }, ConsistentRead: true })
    ).Item;
    const { head, tail } = waitingTickets(item);
    if (!item || head >= tail) break;
    const permits = Number(item[PERMITS_IN_USE]?.N ?? '0');
    const lockLimit = item[CONCURRENCY_LIMIT]?.N;
    // The permits a collector waits for are not free to anyone else (lock-schema.ts, COLLECTING).
    const collecting = Number(item[COLLECTING]?.N ?? '0') > 0;
    const free = lockLimit !== undefined && permits < Number(lockLimit) && (!collecting || permits < Number(item[COLLECT_GATE]?.N ?? '0'));
    const ticket = head + 1;
    const handoffId = yield* uuid();
    // Serving a ticket refuses its waiter's next wait: read it first, and serve it only to pass it
    // (an item nobody wrote yet: its waiter, perhaps on its way, is refused and takes a new ticket)
    // or right before it is admitted.
    let served = yield* readTicket(options.tableName, lockName, ticket);
    if (served === undefined) {
      if (!free) break; // on its way, perhaps: the next release serves it
      served = yield* serveTicket(options.tableName, lockName, ticket, handoffId);
    }
    const waiter = served?.[TICKET_WAITER]?.S;
    const names = { '#head': QUEUE_HEAD };
    const pass = { ':head': { N: String(head) }, ':nextTicket': { N: String(ticket) } };
    if (waiter === undefined) {
      if (yield* update(PASS_TICKET_UPDATE, PASS_TICKET_CONDITION, names, pass)) result.removed++;
      continue;
    }
    const run = served?.[HOLDER_REDRIVE_COUNT]?.N ?? '0';
    if (item[waiter]?.M?.[HOLDER_ACQUIRED_AT] !== undefined) {
      if (yield* update(PASS_TICKET_UPDATE, DROP_TICKET_CONDITION, { ...names, '#next': waiter }, pass)) result.removed++;
      continue;
    }
    if (options.isGone && (yield* options.isGone(waiter, Number(run)))) {
      if (yield* update(PASS_TICKET_UPDATE, PASS_TICKET_CONDITION, names, pass)) {
        result.removed++;
        if (served?.[TICKET_SERVED_BY]?.S !== undefined) yield* deleteServedTicket(options.tableName, lockName, ticket, served[TICKET_SERVED_BY].S!);
      }
      continue;
    }
    // Below the lock's limit and the waiter's own (limits read from the input differ per execution).
    const limits = [lockLimit, served?.[CONCURRENCY_LIMIT]?.N].filter((n): n is string => n !== undefined).map(Number);
    if (!free || permits >= Math.min(...limits)) break;
    // Its turn: mark it served, so that no wait renews its token any more, and take the token it has.
    if (served?.[TICKET_SERVED_BY] === undefined) served = yield* serveTicket(options.tableName, lockName, ticket, handoffId);
    const token = served?.[TICKET_WAIT_TOKEN]?.S;
    if (token === undefined) break;
    const fence = Number(item[FENCING_TOKEN]?.N ?? '0') + 1;
    const now = yield* clock();
    const admitted = yield* update(
      'SET #permits = :permitsAfter, #fence = :fence, #next = :entry, #head = :nextTicket',
      // Not the permits a collector is waiting for (lock-schema.ts, COLLECTING): only below its gate.
      `#permits = :permits AND ${item[FENCING_TOKEN] ? '#fence = :fenceBefore' : 'attribute_not_exists(#fence)'} AND #head = :head AND attribute_not_exists(#next) ` +
        `AND (${NOT_COLLECTING} OR ${NAMES.permits} < ${NAMES.collectGate})`,
      { '#permits': PERMITS_IN_USE, '#fence': FENCING_TOKEN, '#next': waiter, [NAMES.collecting]: COLLECTING, [NAMES.collectGate]: COLLECT_GATE, ...names },
      {
        [VALUES.zero]: { N: '0' },
        ':permits': { N: String(permits) },
        ':permitsAfter': { N: String(permits + 1) },
        ':fence': { N: String(fence) },
        ...(item[FENCING_TOKEN] ? { ':fenceBefore': { N: String(fence - 1) } } : {}),
        ...pass,
        ':entry': {
          M: {
            [HOLDER_ACQUIRED_AT]: { S: new Date(now).toISOString() },
            [HOLDER_REDRIVE_COUNT]: { N: run },
            [HOLDER_LEASE_SECONDS]: { N: served?.[HOLDER_LEASE_SECONDS]?.N ?? '0' },
            [HOLDER_FENCING_TOKEN]: { N: String(fence) },
          },
        },
      },
    );
    if (!admitted) continue;
    try {
      yield* stepFunctions('SendTaskSuccess', { taskToken: token, output: JSON.stringify({ fencingToken: fence }) });
      result.admitted++;
      const servedBy = served?.[TICKET_SERVED_BY]?.S;
      if (servedBy !== undefined) yield* deleteServedTicket(options.tableName, lockName, ticket, servedBy);
    } catch (e) {
      // Not delivered for another reason: the waiter finds its permit when its wait times out.
      if (!TOKEN_GONE.includes(errorName(e))) {
        options.onWakeUpLost?.(waiter, e as Error);
        break;
      }
      // Its task is gone: give the permit back, unless the waiter found and claimed it meanwhile.
      yield* update(
        'SET #permits = #permits - :one REMOVE #next',
        '#next.#fencingToken = :fence AND attribute_not_exists(#next.#claimed)',
        { '#permits': PERMITS_IN_USE, '#next': waiter, '#fencingToken': HOLDER_FENCING_TOKEN, '#claimed': HOLDER_CLAIMED },
        { ':one': { N: '1' }, ':fence': { N: String(fence) } },
      );
    }
  }
  return result;
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
