import { CreateTableCommand } from '@aws-sdk/client-dynamodb';
import { configNamed } from '../checker/configs';
import { DeleteItemInput, Item, ModelDynamoDb, stableStringify, UpdateItemInput } from '../checker/dynamodb-model';
import { RecordedUpdate } from '../checker/model';
import { checkConfig } from '../checker/run';
import { acquireAttempt } from '../client/semaphore-client';
import { LocalDynamoDb } from '../simulator';
import {
  COLLECTING,
  ACQUIRE_CONDITION,
  HOLDER_ACQUIRED_AT,
  HOLDER_LEASE_SECONDS,
  HOLDER_REDRIVE_COUNT,
  ACQUIRE_UPDATE,
  CLAIM_CONDITION,
  CLAIM_UPDATE,
  CONCURRENCY_LIMIT,
  FENCING_TOKEN,
  LOCK_KEY,
  NAMES,
  PERMITS_IN_USE,
  RATE_INTERVAL,
  DELETE_SERVED_CONDITION,
  FIRST_WAIT_CONDITION,
  QUEUE_HEAD,
  QUEUE_NAMES,
  QUEUE_TAIL,
  QUEUE_VALUES,
  MARK_TICKET_CONDITION,
  SERVE_TICKET_CONDITION,
  SERVE_TICKET_UPDATE,
  TAKE_TICKET_CONDITION,
  TAKE_TICKET_UPDATE,
  ticketKey,
  TICKET_SERVED_BY,
  TICKET_WAIT_TOKEN,
  TICKET_WAITER,
  VALUES,
  WAIT_AGAIN_CONDITION,
  WAIT_ON_TICKET_UPDATE,
} from '../src/private/lock-schema';

/*
 * The protocol checker evaluates DynamoDB expressions with its own model (checker/dynamodb-model.ts).
 * Here the model's steps are replayed against dynalite, an independent implementation with DynamoDB's
 * semantics: the same item before, the same request (the real expressions from lock-schema.ts, with
 * the values the synthesized state machines and the flows computed), and the same outcome is expected:
 * applied or refused (and with which error), the attributes returned, and the item after.
 */

const TABLE = 'conformance';
// Started on first use, after the searches: a search blocks the event loop for seconds, and a server
// started before it reset the first connection made after it (ECONNRESET) on a loaded machine.
let started: Promise<LocalDynamoDb> | undefined;
const created = new Set<string>();

afterAll(async () => {
  await (await started)?.stop();
});

async function ensureTable(name: string, attempt = 1): Promise<void> {
  if (created.has(name)) return;
  const db = await (started ??= LocalDynamoDb.start());
  try {
    await db.client.send(
      new CreateTableCommand({
        TableName: name,
        KeySchema: [{ AttributeName: LOCK_KEY, KeyType: 'HASH' }],
        AttributeDefinitions: [{ AttributeName: LOCK_KEY, AttributeType: 'S' }],
        BillingMode: 'PAY_PER_REQUEST',
      }),
    );
  } catch (e) {
    // A connection reset is the local socket's, not DynamoDB's answer: try once more.
    if (attempt === 1 && /ECONNRESET/.test(String((e as Error).message))) return ensureTable(name, 2);
    if ((e as Error).name !== 'ResourceInUseException') throw e;
  }
  created.add(name);
}

/** A request, and which call it is (UpdateItem unless told). */
type Request = UpdateItemInput | (DeleteItemInput & { UpdateExpression?: undefined });
const callOf = (input: Request) => (input.UpdateExpression === undefined ? 'DeleteItem' : 'UpdateItem');

/** The outcome of a request on dynalite, from the item `before`. */
async function onDynalite(before: Item | undefined, input: Request): Promise<Omit<RecordedUpdate, 'input' | 'before'>> {
  await ensureTable(input.TableName);
  const db = await started!;
  if (before) await db.call('PutItem', { TableName: input.TableName, Item: before });
  else await db.call('DeleteItem', { TableName: input.TableName, Key: input.Key });
  let error: string | undefined;
  let attributes: Item | undefined;
  try {
    attributes = (await db.call(callOf(input), input)).Attributes as Item | undefined;
  } catch (e) {
    error = (e as Error).name;
  }
  const after = (await db.call('GetItem', { TableName: input.TableName, Key: input.Key, ConsistentRead: true })).Item as Item | undefined;
  return { error, attributes: error ? undefined : attributes, after };
}

/** The outcome of a request on the model, from the item `before`. */
function onModel(before: Item | undefined, input: Request): Omit<RecordedUpdate, 'input' | 'before'> {
  const key = stableStringify([input.Key[LOCK_KEY]]);
  const tables = { [input.TableName]: before ? { [key]: JSON.parse(JSON.stringify(before)) } : {} };
  const model = new ModelDynamoDb(tables, { [input.TableName]: [LOCK_KEY] });
  let error: string | undefined;
  let attributes: Item | undefined;
  try {
    attributes = (input.UpdateExpression === undefined ? model.deleteItem(input) : model.updateItem(input)).Attributes;
  } catch (e) {
    error = (e as Error).name;
  }
  return { error, attributes, after: model.getItem({ TableName: input.TableName, Key: input.Key }).Item };
}

function same(outcome: Omit<RecordedUpdate, 'input' | 'before'>) {
  return {
    error: outcome.error,
    attributes: outcome.attributes && stableStringify(outcome.attributes),
    after: outcome.after && stableStringify(outcome.after),
  };
}

const key = { [LOCK_KEY]: { S: 'lock' } };
const holder = 'arn:aws:states:us-east-1:123456789012:execution:wf:a';
const entry = (run: number) => ({ M: { [HOLDER_ACQUIRED_AT]: { S: '2026-01-01T00:00:00.000Z' }, [HOLDER_REDRIVE_COUNT]: { N: String(run) } } });
const acquire = (limit: number): UpdateItemInput => ({
  TableName: TABLE,
  Key: key,
  ConditionExpression: ACQUIRE_CONDITION,
  UpdateExpression: ACQUIRE_UPDATE,
  ExpressionAttributeNames: {
    [NAMES.permits]: PERMITS_IN_USE,
    [NAMES.holder]: holder,
    [NAMES.limit]: CONCURRENCY_LIMIT,
    [NAMES.fence]: FENCING_TOKEN,
    [NAMES.collecting]: COLLECTING,
  },
  ExpressionAttributeValues: { [VALUES.zero]: { N: '0' }, [VALUES.one]: { N: '1' }, [VALUES.limit]: { N: String(limit) }, [VALUES.entry]: entry(1) },
  ReturnValues: 'UPDATED_NEW',
});
const claim = (run: number): UpdateItemInput => ({
  TableName: TABLE,
  Key: key,
  ConditionExpression: CLAIM_CONDITION,
  UpdateExpression: CLAIM_UPDATE,
  ExpressionAttributeNames: { [NAMES.holder]: holder, [NAMES.fence]: FENCING_TOKEN },
  ExpressionAttributeValues: {
    [VALUES.zero]: { N: '0' },
    [VALUES.one]: { N: '1' },
    [QUEUE_VALUES.claimed]: { BOOL: true },
    [VALUES.acquiredAt]: { S: '2026-01-01T00:15:00.000Z' },
    [VALUES.redriveCount]: { N: String(run) },
  },
  ReturnValues: 'UPDATED_NEW',
});

/** A client's acquire (the CLI's) of one permit under limit 1, naming the rate's interval: the request its flow makes. */
const clientAcquireWithRate = (rateIntervalSeconds: number): UpdateItemInput => {
  const flow = acquireAttempt({ tableName: TABLE, clockSkewMs: 30_000 }, 'lock', 'lease-1', { limit: 1, leaseSeconds: 60, rateIntervalSeconds });
  const effect = flow.next().value;
  expect(effect).toEqual({ service: 'clock' });
  const call = flow.next(Date.parse('2026-01-01T00:00:00.000Z')).value;
  expect(call).toMatchObject({ service: 'dynamodb', action: 'UpdateItem' });
  return (call as { input: UpdateItemInput }).input;
};

const takeTicket = (): UpdateItemInput => ({
  TableName: TABLE,
  Key: key,
  ConditionExpression: TAKE_TICKET_CONDITION,
  UpdateExpression: TAKE_TICKET_UPDATE,
  ExpressionAttributeNames: {
    [NAMES.permits]: PERMITS_IN_USE,
    [NAMES.holder]: holder,
    [QUEUE_NAMES.tail]: QUEUE_TAIL,
    [QUEUE_NAMES.head]: QUEUE_HEAD,
    [NAMES.collecting]: COLLECTING,
  },
  ExpressionAttributeValues: { [VALUES.limit]: { N: '1' }, [VALUES.zero]: { N: '0' }, [VALUES.one]: { N: '1' } },
  ReturnValues: 'UPDATED_NEW',
});
const ticketItemKey = { [LOCK_KEY]: { S: ticketKey('lock', 4) } };
const ticket = (extra: Item = {}): Item => ({ ...ticketItemKey, ...extra });
const mine = (run: number): Item => ({
  [TICKET_WAITER]: { S: holder },
  [HOLDER_REDRIVE_COUNT]: { N: String(run) },
  [HOLDER_LEASE_SECONDS]: { N: '0' },
  [CONCURRENCY_LIMIT]: { N: '1' },
  [TICKET_WAIT_TOKEN]: { S: 'token-0' },
});
const waitOnTicket = (condition: string, run: number): UpdateItemInput => ({
  TableName: TABLE,
  Key: ticketItemKey,
  ConditionExpression: condition,
  UpdateExpression: WAIT_ON_TICKET_UPDATE,
  ExpressionAttributeNames: {
    [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY,
    [QUEUE_NAMES.waiter]: TICKET_WAITER,
    [QUEUE_NAMES.run]: HOLDER_REDRIVE_COUNT,
    [QUEUE_NAMES.lease]: HOLDER_LEASE_SECONDS,
    [QUEUE_NAMES.token]: TICKET_WAIT_TOKEN,
    [NAMES.limit]: CONCURRENCY_LIMIT,
  },
  ExpressionAttributeValues: {
    [QUEUE_VALUES.me]: { S: holder },
    [VALUES.redriveCount]: { N: String(run) },
    [QUEUE_VALUES.lease]: { N: '0' },
    [VALUES.limit]: { N: '1' },
    [QUEUE_VALUES.token]: { S: `token-${run}-renewed` },
  },
});
/** Mark a ticket served (the release's refused-serve path, the client's and the queue service's serve). */
const mark = (servedBy: string): UpdateItemInput => ({
  TableName: TABLE,
  Key: ticketItemKey,
  ConditionExpression: MARK_TICKET_CONDITION,
  UpdateExpression: SERVE_TICKET_UPDATE,
  ExpressionAttributeNames: { [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY },
  ExpressionAttributeValues: { [QUEUE_VALUES.servedBy]: { S: servedBy } },
  ReturnValues: 'ALL_NEW',
});
/** The workflow's serve: delete the item of a ticket with a waiter, not marked served, reading it (ALL_OLD). */
const serve = (): Request => ({
  TableName: TABLE,
  Key: ticketItemKey,
  ConditionExpression: SERVE_TICKET_CONDITION,
  ExpressionAttributeNames: { [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY, [QUEUE_NAMES.waiter]: TICKET_WAITER },
  ReturnValues: 'ALL_OLD',
});
const deleteServed = (servedBy: string): Request => ({
  TableName: TABLE,
  Key: ticketItemKey,
  ConditionExpression: DELETE_SERVED_CONDITION,
  ExpressionAttributeNames: { [QUEUE_NAMES.servedBy]: TICKET_SERVED_BY },
  ExpressionAttributeValues: { [QUEUE_VALUES.servedBy]: { S: servedBy } },
});

describe('edge cases the protocol relies on, on the model and on dynalite alike', () => {
  const lock = (extra: Item = {}): Item => ({ ...key, [PERMITS_IN_USE]: { N: '1' }, [CONCURRENCY_LIMIT]: { N: '1' }, [FENCING_TOKEN]: { N: '4' }, ...extra });
  test.each<[string, Item | undefined, Request, string | undefined]>([
    ['the first acquire creates the lock item', undefined, acquire(1), undefined],
    ['an acquire on a full lock is refused', lock({ other: entry(0) }), acquire(1), 'ConditionalCheckFailedException'],
    ['an acquire that finds its own entry fails on it (ValidationException), whether the lock is full or not', lock({ [holder]: entry(0) }), acquire(1), 'ValidationException'],
    ['... also below the limit', lock({ [holder]: entry(0) }), acquire(5), 'ValidationException'],
    ['a claim stamps the run on an entry of an earlier run', lock({ [holder]: entry(0) }), claim(1), undefined],
    ['a claim is refused on an entry of a later run', lock({ [holder]: entry(2) }), claim(1), 'ConditionalCheckFailedException'],
    ['a claim is refused without an entry', lock(), claim(1), 'ConditionalCheckFailedException'],
    [
      'two paths that overlap are a ValidationException',
      lock({ [holder]: entry(0) }),
      {
        TableName: TABLE,
        Key: key,
        UpdateExpression: 'SET #a = :v REMOVE #b',
        ExpressionAttributeNames: { '#a': holder, '#b': holder },
        ExpressionAttributeValues: { ':v': { N: '1' } },
      },
      'ValidationException',
    ],
    ['a client acquire that names the rate records it on a lock that records none', undefined, clientAcquireWithRate(10), undefined],
    ['... and keeps the interval a lock records', lock({ [PERMITS_IN_USE]: { N: '0' }, [RATE_INTERVAL]: { N: '30' } }), clientAcquireWithRate(10), undefined],
    ['a ticket is taken on a full lock: the first creates both counters', lock({ other: entry(0) }), takeTicket(), undefined],
    ['... and the next is the tail plus one', lock({ other: entry(0), [QUEUE_HEAD]: { N: '3' }, [QUEUE_TAIL]: { N: '5' } }), takeTicket(), undefined],
    ['a ticket is refused below the limit', lock({ [PERMITS_IN_USE]: { N: '0' } }), takeTicket(), 'ConditionalCheckFailedException'],
    ['a ticket is refused to a holder', lock({ [holder]: entry(0) }), takeTicket(), 'ConditionalCheckFailedException'],
    ['the first wait writes an unwritten ticket item', undefined, waitOnTicket(FIRST_WAIT_CONDITION, 0), undefined],
    ['the first wait is refused on a ticket skipped meanwhile (served, no waiter)', ticket({ [TICKET_SERVED_BY]: { S: 'h/0' } }), waitOnTicket(FIRST_WAIT_CONDITION, 0), 'ConditionalCheckFailedException'],
    ['a wait again renews the token of its own run', ticket(mine(0)), waitOnTicket(WAIT_AGAIN_CONDITION, 0), undefined],
    ['a wait again is refused on the ticket of another run', ticket(mine(0)), waitOnTicket(WAIT_AGAIN_CONDITION, 1), 'ConditionalCheckFailedException'],
    ['a wait again is refused once served', ticket({ ...mine(0), [TICKET_SERVED_BY]: { S: 'h/0' } }), waitOnTicket(WAIT_AGAIN_CONDITION, 0), 'ConditionalCheckFailedException'],
    ['a wait again is refused once the item is gone', undefined, waitOnTicket(WAIT_AGAIN_CONDITION, 0), 'ConditionalCheckFailedException'],
    ['serving deletes the ticket and returns it whole (ALL_OLD)', ticket(mine(0)), serve(), undefined],
    ['serving a missing ticket is refused (its waiter is not there, or it was served)', undefined, serve(), 'ConditionalCheckFailedException'],
    ['serving a ticket marked served is refused', ticket({ ...mine(0), [TICKET_SERVED_BY]: { S: 'h/0' } }), serve(), 'ConditionalCheckFailedException'],
    ['serving a ticket without a waiter is refused', ticket({ [TICKET_SERVED_BY]: { S: 'passed' } }), serve(), 'ConditionalCheckFailedException'],
    ['a first wait after the serve deleted the item writes it anew (the sweep marks that passed ticket)', undefined, waitOnTicket(FIRST_WAIT_CONDITION, 1), undefined],
    ['marking a missing ticket creates it marked and without a waiter', undefined, mark('h/0'), undefined],
    ['marking returns the whole ticket (ALL_NEW)', ticket(mine(0)), mark('h/0'), undefined],
    ['marking a ticket served already is refused', ticket({ ...mine(0), [TICKET_SERVED_BY]: { S: 'h/0' } }), mark('h/1'), 'ConditionalCheckFailedException'],
    ['the client and the queue service delete a ticket they marked served', ticket({ ...mine(0), [TICKET_SERVED_BY]: { S: 'h/0' } }), deleteServed('h/0'), undefined],
    ['... and not one another releaser served', ticket({ ...mine(0), [TICKET_SERVED_BY]: { S: 'h/1' } }), deleteServed('h/0'), 'ConditionalCheckFailedException'],
    ['... nor a missing one', undefined, deleteServed('h/0'), 'ConditionalCheckFailedException'],
    [
      'an unused expression attribute value is a ValidationException',
      lock(),
      { TableName: TABLE, Key: key, UpdateExpression: 'SET #p = :one', ExpressionAttributeNames: { '#p': PERMITS_IN_USE }, ExpressionAttributeValues: { ':one': { N: '1' }, ':two': { N: '2' } } },
      'ValidationException',
    ],
  ])('%s', async (_name, before, input, expected) => {
    const model = onModel(before, input);
    expect(model.error).toBe(expected);
    expect(same(await onDynalite(before, input))).toEqual(same(model));
  });
});

test('a client acquire that names the rate records it where the lock records none, and keeps a recorded one', async () => {
  const fresh = await onDynalite(undefined, clientAcquireWithRate(10));
  expect(fresh.error).toBeUndefined();
  expect(fresh.after?.[RATE_INTERVAL]).toEqual({ N: '10' });
  expect(fresh.after?.['lease-1']).toBeDefined();
  const recorded = await onDynalite({ ...key, [PERMITS_IN_USE]: { N: '0' }, [RATE_INTERVAL]: { N: '30' } }, clientAcquireWithRate(10));
  expect(recorded.after?.[RATE_INTERVAL]).toEqual({ N: '30' });
  expect(recorded.after?.[PERMITS_IN_USE]).toEqual({ N: '1' });
});

test('sampled steps of the checker\'s searches give the same outcome on dynalite', async () => {
  const recorded = new Map<string, RecordedUpdate>();
  for (const name of ['queue-stops', 'queue-server-errors', 'sweep-stale', 'redrive-guard', 'polling', 'clients']) {
    checkConfig(configNamed(name), {
      maxStates: 1_500,
      liveness: false,
      onUpdateItem: (call) => recorded.set(stableStringify([call.before, call.input]), call),
    });
  }
  const calls = [...recorded.values()];
  // Every few distinct steps, so that every configuration and outcome is in the sample.
  const step = Math.max(1, Math.floor(calls.length / 400));
  const sample = calls.filter((_c, i) => i % step === 0);
  const outcomes = { applied: 0, refused: 0, invalid: 0 };
  for (const call of sample) {
    const dynalite = await onDynalite(call.before, call.input);
    expect({ request: call.input, before: call.before, ...same(dynalite) }).toEqual({ request: call.input, before: call.before, ...same(call) });
    if (call.error === undefined) outcomes.applied++;
    else if (call.error === 'ConditionalCheckFailedException') outcomes.refused++;
    else outcomes.invalid++;
  }
  // The sample has every kind of outcome: writes applied, conditions refused, requests rejected as invalid;
  // and deletes (the serve of a ticket, Leave Queue, the client's tidying) beside the updates.
  expect(sample.filter((c) => c.input.UpdateExpression === undefined).length).toBeGreaterThan(0);
  expect(sample.length).toBeGreaterThan(150);
  expect(outcomes.applied).toBeGreaterThan(20);
  expect(outcomes.refused).toBeGreaterThan(20);
  expect(outcomes.invalid).toBeGreaterThan(0);
});
