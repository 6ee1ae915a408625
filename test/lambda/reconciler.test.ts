import { ConditionalCheckFailedException, DeleteItemCommand, DynamoDBClient, GetItemCommand, UpdateItemCommand } from '@aws-sdk/client-dynamodb';
import {
  DescribeExecutionCommand,
  ExecutionDoesNotExist,
  GetExecutionHistoryCommand,
  ListExecutionsCommand,
  SendTaskSuccessCommand,
  SFNClient,
  StopExecutionCommand,
} from '@aws-sdk/client-sfn';
import { DynamoDBDocumentClient, ScanCommand, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import { mockClient } from 'aws-sdk-client-mock';
import { GRACE_MS, GUARD_PATIENCE_MS } from '../../lambda/reconciler-flows';
import { handler, ReconcilerResult, RedriveGuardResult } from '../../lambda/reconciler.lambda';
import {
  ACQUIRE_CONDITION,
  ACQUIRE_WITH_BODY_SLOT_CONDITION,
  BODY_SLOT_AND_PERMIT_HELD_CONDITION,
  CLAIM_CONDITION,
  CLAIM_WITH_BODY_SLOT_CONDITION,
  CLAIM_WITH_BODY_SLOT_UPDATE,
  CLAIM_UPDATE,
  HOLDER_ACQUIRED_AT,
  HOLDER_COLLECTING,
  HOLDER_EXTRA_PERMITS,
  HOLDER_IN_BODY,
  HOLDER_LEASE_EXPIRES_AT,
  HOLDER_LEASE_SECONDS,
  HOLDER_PERMITS,
  HOLDER_REDRIVE_COUNT,
  RELEASE_SEEN_HOLDER_CONDITION,
  RELEASE_UPDATE,
  RETAKE_PERMIT_IN_SLOT_CONDITION,
  RELEASE_PARTIAL_CONDITION,
  RETAKE_PERMIT_IN_SLOT_UPDATE,
  TICKET_SERVED_BY,
  TICKET_WAIT_TOKEN,
  TICKET_WAITER,
  ticketKey,
  WEIGHTED_ACQUIRE_CONDITION,
  WEIGHTED_CLAIM_CONDITION,
  executionHolderKey,
} from '../../src/private/lock-schema';
import { RATE_HOLD_STATES, STATE } from '../../src/private/state-names';

/*
 * The reconciler's handler with the AWS SDK mocked: the decisions it takes for each kind of holder.
 * Its behaviour against real DynamoDB semantics and executions runs in the simulator
 * (test/reconciler-simulation.test.ts).
 */

const ddb = mockClient(DynamoDBDocumentClient);
/** The plain client: the queue's service (dropWaiter, serveQueue) reads and writes the lock item with it. */
const raw = mockClient(DynamoDBClient);
const sfn = mockClient(SFNClient);
const SM = 'arn:aws:states:us-east-1:123456789012:stateMachine:Guarded';
const exec = (name: string, sm = 'Guarded') => `arn:aws:states:us-east-1:123456789012:execution:${sm}:${name}`;
/** The holder id the workflow writes for that execution (the tests below that key entries by the ARN are those of versions before it). */
const key = (name: string, sm = 'Guarded') => executionHolderKey(`arn:aws:states:us-east-1:123456789012:stateMachine:${sm}`, name);
/** A holder entry, by default taken two minutes ago: past the sweep's grace period. */
const entry = (acquiredAt = new Date(Date.now() - 2 * GRACE_MS).toISOString(), extra: Record<string, unknown> = {}) => ({
  [HOLDER_ACQUIRED_AT]: acquiredAt,
  ...extra,
});

const sweep = (...args: Parameters<typeof handler>) => handler(...args) as Promise<ReconcilerResult>;
const guard = (...args: Parameters<typeof handler>) => handler(...args) as Promise<RedriveGuardResult>;

beforeEach(() => {
  ddb.reset();
  raw.reset();
  raw.on(GetItemCommand).resolves({});
  sfn.reset();
  sfn.on(ListExecutionsCommand).resolves({ executions: [] });
  process.env.TABLE_NAME = 'locks';
  process.env.STATE_MACHINE_ARNS = SM;
  jest.spyOn(console, 'log').mockImplementation(() => undefined);
});

afterEach(() => jest.restoreAllMocks());

function statuses(byExecution: Record<string, string | Error>, redriveCount = 0) {
  for (const [arn, status] of Object.entries(byExecution)) {
    const stub = sfn.on(DescribeExecutionCommand, { executionArn: arn });
    if (status instanceof Error) stub.rejects(status);
    else stub.resolves({ status: status as any, redriveCount });
  }
}

const conditionFailed = () => new ConditionalCheckFailedException({ message: 'The conditional request failed', $metadata: {} });
/** What DynamoDB answers an acquire of a holder that has an entry (see ACQUIRE_CONDITION). */
const ownEntry = () => Object.assign(new Error('An operand in the update expression has an incorrect data type'), { name: 'ValidationException' });

function releasedHolders(): string[] {
  return ddb.commandCalls(UpdateCommand).map((c) => c.args[0].input.ExpressionAttributeNames!['#holder']);
}

test('releases holders whose execution is no longer running or does not exist, leaves running ones', async () => {
  ddb.on(ScanCommand).resolves({
    Items: [{ lockName: 'db', permitsInUse: 3, [exec('done')]: entry(), [exec('gone')]: entry(), [exec('busy')]: entry() }],
  });
  statuses({
    [exec('done')]: 'ABORTED',
    [exec('gone')]: new ExecutionDoesNotExist({ message: 'no such execution', $metadata: {} }),
    [exec('busy')]: 'RUNNING',
  });
  ddb.on(UpdateCommand).resolves({});

  const result = await sweep({});

  expect(releasedHolders().sort()).toEqual([exec('done'), exec('gone')]);
  expect(ddb.commandCalls(UpdateCommand)[0].args[0].input).toMatchObject({
    TableName: 'locks',
    Key: { lockName: 'db' },
    UpdateExpression: RELEASE_UPDATE,
    // Only the very entry it judged dead, of the run it judged: a redriven execution's new entry has
    // another acquire time and a later run.
    ConditionExpression: RELEASE_SEEN_HOLDER_CONDITION,
    ExpressionAttributeValues: { ':zero': 0, ':one': 1, ':acquiredAt': expect.any(String), ':redriveCount': 0 },
  });
  expect(result.reclaimed.map((r) => r.reason).sort()).toEqual(['execution ABORTED', 'execution DOES_NOT_EXIST']);
  expect(result).toMatchObject({ locks: 1, holders: 3, errors: [], truncated: false });
});

test('F5: leaves an entry younger than the grace period, even if its execution reads as not existing or ended', async () => {
  const young = new Date(Date.now() - GRACE_MS / 2).toISOString();
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'db', permitsInUse: 2, [exec('new')]: entry(young), [exec('stale')]: entry(young) }] });
  statuses({ [exec('new')]: new ExecutionDoesNotExist({ message: 'no such execution', $metadata: {} }), [exec('stale')]: 'FAILED' });
  ddb.on(UpdateCommand).resolves({});

  const result = await sweep({});

  expect(ddb.commandCalls(UpdateCommand)).toHaveLength(0);
  expect(sfn.commandCalls(DescribeExecutionCommand)).toHaveLength(0);
  expect(result.reclaimed).toEqual([]);
});

test('F5: judges runs: a description older than the entry leaves it, an entry of an ended run goes with that run', async () => {
  ddb.on(ScanCommand).resolves({
    Items: [{ lockName: 'db', permitsInUse: 2, [exec('redriven')]: entry(undefined, { [HOLDER_REDRIVE_COUNT]: 1 }), [exec('left')]: entry(undefined, { [HOLDER_REDRIVE_COUNT]: 0 }) }],
  });
  // 'redriven' took its entry in run 1, and the description still shows run 0 FAILED (stale).
  statuses({ [exec('redriven')]: 'FAILED' }, 0);
  // 'left' took its entry in run 0 and now runs run 1, which has no entry stamped with it.
  statuses({ [exec('left')]: 'RUNNING' }, 1);
  ddb.on(UpdateCommand).resolves({});

  const result = await sweep({});

  expect(releasedHolders()).toEqual([exec('left')]);
  expect(ddb.commandCalls(UpdateCommand)[0].args[0].input.ExpressionAttributeValues).toMatchObject({ ':redriveCount': 0 });
  expect(result.reclaimed).toEqual([{ lockName: 'db', holder: exec('left'), executionArn: exec('left'), reason: 'entry of run 0; the execution runs run 1' }]);
});

test('stops a running execution past its lease, and only then releases it', async () => {
  const acquiredAt = new Date(Date.now() - 120_000).toISOString();
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'db', permitsInUse: 1, [exec('slow')]: entry(acquiredAt, { [HOLDER_LEASE_SECONDS]: 60 }) }] });
  statuses({ [exec('slow')]: 'RUNNING' });
  const order: string[] = [];
  sfn.on(StopExecutionCommand).callsFake(() => order.push('stop'));
  ddb.on(UpdateCommand).callsFake(() => order.push('release'));

  const result = await sweep({});

  expect(order).toEqual(['stop', 'release']);
  expect(sfn.commandCalls(StopExecutionCommand)[0].args[0].input).toMatchObject({
    executionArn: exec('slow'),
    error: 'SemaphoreLeaseExpired',
    cause: expect.stringContaining("lock 'db' for more than its lease of 60 s"),
  });
  expect(result.stopped).toEqual([exec('slow')]);
});

describe('under a rate limit (HOLD_AFTER_STOP_SECONDS)', () => {
  beforeEach(() => {
    process.env.HOLD_AFTER_STOP_SECONDS = '600';
    process.env.CLOCK_SKEW_SECONDS = '30';
  });
  afterEach(() => {
    delete process.env.HOLD_AFTER_STOP_SECONDS;
    delete process.env.CLOCK_SKEW_SECONDS;
  });
  const ago = (ms: number) => new Date(Date.now() - ms);

  test('frees a stopped holder only once the interval and the clock skew have passed since it stopped', async () => {
    ddb.on(ScanCommand).resolves({
      Items: [{ lockName: 'db', permitsInUse: 3, [exec('recent')]: entry(), [exec('old')]: entry(ago(3_600_000).toISOString()), [exec('nodate')]: entry() }],
    });
    sfn.on(DescribeExecutionCommand, { executionArn: exec('recent') }).resolves({ status: 'ABORTED', redriveCount: 0, stopDate: ago(600_000) });
    sfn.on(DescribeExecutionCommand, { executionArn: exec('old') }).resolves({ status: 'FAILED', redriveCount: 0, stopDate: ago(631_000) });
    // No stop time to judge by: held until a sweep can read one.
    sfn.on(DescribeExecutionCommand, { executionArn: exec('nodate') }).resolves({ status: 'TIMED_OUT', redriveCount: 0 });
    ddb.on(UpdateCommand).resolves({});

    const result = await sweep({});

    expect(releasedHolders()).toEqual([exec('old')]);
    expect(result.reclaimed.map((r) => r.reason)).toEqual(['execution FAILED']);
  });

  test('an entry of a run that has ended goes once the interval has passed since the redrive; an unknown execution since the entry', async () => {
    ddb.on(ScanCommand).resolves({
      Items: [
        {
          lockName: 'db',
          permitsInUse: 3,
          [exec('soon')]: entry(undefined, { [HOLDER_REDRIVE_COUNT]: 0 }),
          [exec('later')]: entry(undefined, { [HOLDER_REDRIVE_COUNT]: 0 }),
          [exec('unknown')]: entry(ago(300_000).toISOString()),
        },
      ],
    });
    sfn.on(DescribeExecutionCommand, { executionArn: exec('soon') }).resolves({ status: 'RUNNING', redriveCount: 1, redriveDate: ago(700_000) });
    sfn.on(DescribeExecutionCommand, { executionArn: exec('later') }).resolves({ status: 'RUNNING', redriveCount: 1, redriveDate: ago(60_000) });
    sfn.on(DescribeExecutionCommand, { executionArn: exec('unknown') }).rejects(new ExecutionDoesNotExist({ message: 'no such execution', $metadata: {} }));
    ddb.on(UpdateCommand).resolves({});

    await sweep({});

    expect(releasedHolders()).toEqual([exec('soon')]);
  });

  test('stops a running execution past its lease, and leaves its permit to the cleanup or a later sweep', async () => {
    ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'db', permitsInUse: 1, [exec('slow')]: entry(ago(3_600_000).toISOString(), { [HOLDER_LEASE_SECONDS]: 900 }) }] });
    statuses({ [exec('slow')]: 'RUNNING' });
    sfn.on(StopExecutionCommand).resolves({});

    const result = await sweep({});

    expect(result.stopped).toEqual([exec('slow')]);
    expect(ddb.commandCalls(UpdateCommand)).toHaveLength(0);
  });
});

test('leaves a running execution within its lease', async () => {
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'db', permitsInUse: 1, [exec('ok')]: entry(new Date().toISOString(), { [HOLDER_LEASE_SECONDS]: 60 }) }] });
  statuses({ [exec('ok')]: 'RUNNING' });

  const result = await sweep({});

  expect(sfn.commandCalls(StopExecutionCommand)).toHaveLength(0);
  expect(ddb.commandCalls(UpdateCommand)).toHaveLength(0);
  expect(result.reclaimed).toEqual([]);
});

test('releases an expired lease of a holder that is not an execution, conditional on it not being renewed', async () => {
  const expired = Date.now() - 60_000;
  const live = Date.now() + 60_000;
  const withinSkew = Date.now() - 5_000;
  ddb.on(ScanCommand).resolves({
    Items: [
      {
        'lockName': 'deploy',
        'permitsInUse': 3,
        'lease:expired': entry(undefined, { [HOLDER_LEASE_EXPIRES_AT]: expired }),
        'lease:live': entry(undefined, { [HOLDER_LEASE_EXPIRES_AT]: live }),
        'lease:skew': entry(undefined, { [HOLDER_LEASE_EXPIRES_AT]: withinSkew }),
      },
    ],
  });
  ddb.on(UpdateCommand).resolves({});

  await sweep({});

  expect(releasedHolders()).toEqual(['lease:expired']);
  expect(ddb.commandCalls(UpdateCommand)[0].args[0].input).toMatchObject({
    ConditionExpression: `attribute_exists(#holder) AND #holder.${HOLDER_LEASE_EXPIRES_AT} = :expiresAt`,
    ExpressionAttributeValues: { ':one': 1, ':expiresAt': expired },
  });
  expect(sfn.commandCalls(DescribeExecutionCommand)).toHaveLength(0);
});

test('an expired registration of a waiting client (no permit, the collector\'s mark) is removed but not counted as a permit reclaimed', async () => {
  const expired = Date.now() - 60_000;
  ddb.on(ScanCommand).resolves({
    Items: [
      {
        'lockName': 'deploy',
        'permitsInUse': 1,
        'collecting': 1,
        'lease:waiting': entry(undefined, { [HOLDER_LEASE_EXPIRES_AT]: expired, [HOLDER_PERMITS]: 0, [HOLDER_COLLECTING]: 1 }),
        'lease:holding': entry(undefined, { [HOLDER_LEASE_EXPIRES_AT]: expired }),
      },
    ],
  });
  ddb.on(UpdateCommand).resolves({});
  const log = console.log as jest.Mock;

  const result = await sweep({});

  expect(releasedHolders().sort()).toEqual(['lease:holding', 'lease:waiting']);
  expect(result.reclaimed).toEqual(
    expect.arrayContaining([
      expect.objectContaining({ holder: 'lease:waiting', registration: true }),
      expect.not.objectContaining({ registration: true }),
    ]),
  );
  const lines = log.mock.calls.map(([line]) => JSON.parse(line));
  // The crashed waiting CLI held nothing: only the holding lease counts (and can set off the reclaim alarm).
  expect(lines).toContainEqual(expect.objectContaining({ TableName: 'locks', PermitsReclaimed: 1 }));
});

test('sweeps entries named by holder ids: describes each execution by the ARN its id names, and releases by the id', async () => {
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'db', permitsInUse: 3, [key('done')]: entry(), [key('busy')]: entry(), [exec('old')]: entry() }] });
  statuses({ [exec('done')]: 'ABORTED', [exec('busy')]: 'RUNNING', [exec('old')]: 'FAILED' });
  ddb.on(UpdateCommand).resolves({});

  const result = await sweep({});

  expect(sfn.commandCalls(DescribeExecutionCommand).map((c) => c.args[0].input.executionArn).sort()).toEqual([exec('busy'), exec('done'), exec('old')]);
  expect(releasedHolders().sort()).toEqual([exec('old'), key('done')].sort());
  expect(result.reclaimed).toEqual(
    expect.arrayContaining([
      { lockName: 'db', holder: key('done'), executionArn: exec('done'), reason: 'execution ABORTED' },
      { lockName: 'db', holder: exec('old'), executionArn: exec('old'), reason: 'execution FAILED' },
    ]),
  );
});

test("leaves other state machines' executions to their own reconcilers", async () => {
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'shared', permitsInUse: 2, [exec('x', 'Other')]: entry(), [key('y', 'Other')]: entry() }] });

  const result = await sweep({});

  expect(sfn.commandCalls(DescribeExecutionCommand)).toHaveLength(0);
  expect(result.reclaimed).toEqual([]);
});

test('a holder released meanwhile (condition fails) is not counted; a failure on one holder does not stop the sweep', async () => {
  ddb.on(ScanCommand).resolves({
    Items: [{ lockName: 'db', permitsInUse: 3, [exec('raced')]: entry(), [exec('broken')]: entry(), [exec('fine')]: entry() }],
  });
  statuses({ [exec('raced')]: 'FAILED', [exec('broken')]: new Error('throttled to death'), [exec('fine')]: 'SUCCEEDED' });
  ddb.on(UpdateCommand, { ExpressionAttributeNames: { '#permits': 'permitsInUse', '#holder': exec('raced') } }).rejects(conditionFailed());
  ddb.on(UpdateCommand, { ExpressionAttributeNames: { '#permits': 'permitsInUse', '#holder': exec('fine') } }).resolves({});

  const result = await sweep({});

  expect(result.reclaimed.map((r) => r.holder)).toEqual([exec('fine')]);
  expect(result.errors).toEqual([{ lockName: 'db', holder: exec('broken'), error: 'Error: throttled to death' }]);
});

test('follows the scan pages, stops early when out of time, and says so', async () => {
  ddb
    .on(ScanCommand)
    .resolvesOnce({ Items: [{ lockName: 'a', permitsInUse: 0 }], LastEvaluatedKey: { lockName: 'a' } })
    .resolvesOnce({ Items: [{ lockName: 'b', permitsInUse: 0 }, { lockName: 'c', permitsInUse: 0 }] });
  let remaining = 60_000;

  const result = await sweep({}, { getRemainingTimeInMillis: () => (remaining -= 20_000) });

  expect(ddb.commandCalls(ScanCommand).map((c) => c.args[0].input.ExclusiveStartKey)).toEqual([undefined, { lockName: 'a' }]);
  expect(result.locks).toBe(2);
  expect(result.truncated).toBe(true);
});

test('stops early inside a lock with many holders, too', async () => {
  const holders = Object.fromEntries(Array.from({ length: 40 }, (_, i) => [exec(`h${i}`), entry()]));
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'big', permitsInUse: 40, ...holders }] });
  sfn.on(DescribeExecutionCommand).resolves({ status: 'RUNNING' });
  let calls = 0;

  // Time for the lock and about ten holders, then no more.
  const result = await sweep({}, { getRemainingTimeInMillis: () => (++calls > 10 ? 5_000 : 60_000) });

  expect(result.truncated).toBe(true);
  expect(sfn.commandCalls(DescribeExecutionCommand).length).toBeGreaterThan(0);
  expect(sfn.commandCalls(DescribeExecutionCommand).length).toBeLessThan(40);
});

test('a dry run changes nothing and reports what it would release', async () => {
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'db', permitsInUse: 1, [exec('done')]: entry() }] });
  statuses({ [exec('done')]: 'TIMED_OUT' });

  const result = await sweep({ dryRun: true });

  expect(ddb.commandCalls(UpdateCommand)).toHaveLength(0);
  expect(result).toMatchObject({ dryRun: true, reclaimed: [{ lockName: 'db', holder: exec('done'), reason: 'execution TIMED_OUT' }] });
});

test('publishes permits in use per lock and reclaimed permits in the Embedded Metric Format', async () => {
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'db', permitsInUse: 2, [exec('done')]: entry(), [exec('busy')]: entry() }] });
  statuses({ [exec('done')]: 'FAILED', [exec('busy')]: 'RUNNING' });
  ddb.on(UpdateCommand).resolves({});
  const log = console.log as jest.Mock;

  await sweep({});

  const lines = log.mock.calls.map(([line]) => JSON.parse(line));
  expect(lines).toContainEqual(
    expect.objectContaining({
      _aws: expect.objectContaining({ CloudWatchMetrics: [expect.objectContaining({ Namespace: 'CdkSfnSemaphore', Dimensions: [['TableName', 'LockName']] })] }),
      TableName: 'locks',
      LockName: 'db',
      PermitsInUse: 1,
      Holders: 1,
    }),
  );
  expect(lines).toContainEqual(expect.objectContaining({ TableName: 'locks', PermitsReclaimed: 1, LeasesExpired: 0, ReconcilerErrors: 0 }));
});

test('a weighted holder\'s permits all count: PermitsInUse by weight, Holders by entry', async () => {
  const weighted = entry(undefined, { [HOLDER_PERMITS]: 3, [HOLDER_EXTRA_PERMITS]: 2 });
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'db', permitsInUse: 6, [exec('done')]: weighted, [exec('busy')]: weighted }] });
  statuses({ [exec('done')]: 'FAILED', [exec('busy')]: 'RUNNING' });
  ddb.on(UpdateCommand).resolves({});
  const log = console.log as jest.Mock;

  const result = await sweep({});

  expect(result).toMatchObject({ reclaimed: [{ lockName: 'db', holder: exec('done') }] });
  const lines = log.mock.calls.map(([line]) => JSON.parse(line));
  expect(lines).toContainEqual(expect.objectContaining({ LockName: 'db', PermitsInUse: 3, Holders: 1 }));
});

test('publishes the queue\'s length, and on a lock with a rate the permits still inside their interval and the waits they cause (only there)', async () => {
  const now = Date.now();
  const at = (msAgo: number) => entry(new Date(now - msAgo).toISOString());
  ddb.on(ScanCommand).resolves({
    Items: [
      // A rate of 5 minutes: taken 2 minutes ago (held by the rate), 10 minutes ago (not any more), and a weighted one of 3 just inside.
      {
        lockName: 'api',
        permitsInUse: 5,
        // Six queued: the rate holds 4 permits, so it keeps 4 of them waiting; 2 wait for the others.
        queueHead: 2,
        queueTail: 8,
        rateIntervalSeconds: 300,
        [exec('recent')]: at(120_000),
        [exec('old')]: at(600_000),
        [exec('heavy')]: { ...at(299_000), [HOLDER_PERMITS]: 3, [HOLDER_EXTRA_PERMITS]: 2 },
      },
      { lockName: 'db', permitsInUse: 1, queueHead: 4, queueTail: 7, [exec('busy')]: entry() },
    ],
  });
  statuses({ [exec('recent')]: 'RUNNING', [exec('old')]: 'RUNNING', [exec('heavy')]: 'RUNNING', [exec('busy')]: 'RUNNING' });
  const log = console.log as jest.Mock;

  await sweep({ dryRun: true });

  const lines = log.mock.calls.map(([line]) => JSON.parse(line));
  const api = lines.find((l) => l.LockName === 'api');
  expect(api).toMatchObject({ PermitsInUse: 5, Holders: 3, Queued: 6, PermitsHeldForRate: 4, WaitingForRate: 4 });
  expect(api._aws.CloudWatchMetrics[0].Metrics.map((m: { Name: string }) => m.Name)).toEqual(['PermitsInUse', 'Holders', 'Queued', 'PermitsHeldForRate', 'WaitingForRate']);
  const db = lines.find((l) => l.LockName === 'db');
  expect(db).toMatchObject({ PermitsInUse: 1, Holders: 1, Queued: 3 });
  expect(db).not.toHaveProperty('PermitsHeldForRate');
  expect(db).not.toHaveProperty('WaitingForRate');
  expect(db._aws.CloudWatchMetrics[0].Metrics.map((m: { Name: string }) => m.Name)).toEqual(['PermitsInUse', 'Holders', 'Queued']);
});

test('a holder the sweep releases no longer counts for the rate', async () => {
  const recent = entry(new Date(Date.now() - 120_000).toISOString());
  ddb.on(ScanCommand).resolves({ Items: [{ lockName: 'api', permitsInUse: 2, rateIntervalSeconds: 300, [exec('gone')]: recent, [exec('busy')]: recent }] });
  statuses({ [exec('gone')]: 'FAILED', [exec('busy')]: 'RUNNING' });
  ddb.on(UpdateCommand).resolves({});
  const log = console.log as jest.Mock;

  const result = await sweep({});

  expect(result).toMatchObject({ reclaimed: [{ holder: exec('gone') }] });
  // Both were taken 2 minutes ago, inside the 5-minute interval; only the one left holds a permit.
  // Nobody is queued: the rate keeps nobody waiting.
  expect(log.mock.calls.map(([line]) => JSON.parse(line))).toContainEqual(
    expect.objectContaining({ LockName: 'api', PermitsInUse: 1, PermitsHeldForRate: 1, Queued: 0, WaitingForRate: 0 }),
  );
  expect(result).not.toHaveProperty('rateHoldsByLock');
  expect(result).not.toHaveProperty('queuedByLock');
});

describe('redrive guard', () => {
  const redrivenAt = new Date(Date.now() - 10_000);
  const redriven = (name: string, input = { tenant: 'acme' }, time = redrivenAt) => ({
    'detail-type': 'Step Functions Execution Status Change',
    'time': time.toISOString(),
    'detail': { executionArn: exec(name), status: 'RUNNING', redriveCount: 1, input: JSON.stringify(input) },
  });
  /** Execution `name` in run 1, redriven at `lastState` (newest first, as the guard reads it). */
  const history = (name: string, lastState: string, status = 'RUNNING') => {
    statuses({ [exec(name)]: status }, 1);
    return sfn.on(GetExecutionHistoryCommand, { executionArn: exec(name) }).resolves({
      events: [
        { id: 9, timestamp: redrivenAt, type: 'ExecutionRedriven', executionRedrivenEventDetails: { redriveCount: 1 } },
        { id: 8, timestamp: new Date(), type: 'ExecutionAborted' },
        { id: 7, timestamp: new Date(), type: 'TaskStateEntered', stateEnteredEventDetails: { name: lastState } },
        { id: 6, timestamp: new Date(), type: 'ParallelStateEntered', stateEnteredEventDetails: { name: 'Run Protected Body' } },
      ],
    });
  };

  beforeEach(() => {
    process.env.LOCK_NAME = 'db';
    process.env.CONCURRENCY_LIMIT = '2';
    delete process.env.LOCK_NAME_PATH;
  });

  test('takes a permit again for an execution redriven inside the body, stamped with its run, with a body slot', async () => {
    history('r1', 'Do Work');
    ddb.on(UpdateCommand).resolves({});

    const result = await guard(redriven('r1'));

    expect(result).toEqual({ executionArn: exec('r1'), resumedAt: 'Do Work', action: 'permit taken again' });
    expect(ddb.commandCalls(UpdateCommand)[0].args[0].input).toMatchObject({
      Key: { lockName: 'db' },
      // The user's body needs a body slot too, wherever the lock records a limit of them (a rate above the concurrency limit).
      ConditionExpression: ACQUIRE_WITH_BODY_SLOT_CONDITION,
      ExpressionAttributeNames: { '#holder': key('r1'), '#bodies': 'bodiesRunning', '#bodyLimit': 'bodyLimit' },
      ExpressionAttributeValues: { ':limit': 2, ':entry': { [HOLDER_REDRIVE_COUNT]: 1, [HOLDER_ACQUIRED_AT]: expect.any(String), [HOLDER_IN_BODY]: 1 } },
    });
    expect(sfn.commandCalls(StopExecutionCommand)).toHaveLength(0);
  });

  test.each(RATE_HOLD_STATES)('under a rate limit, a run in %s is inside: the permit must stay held there', async (state) => {
    history('r9', state);
    ddb.on(UpdateCommand).resolves({});

    const result = await guard(redriven('r9'));

    expect(result).toEqual({ executionArn: exec('r9'), resumedAt: state, action: 'permit taken again' });
    // Its body has ended: the permit only, no body slot; but the rate's Wait beside the body starts with
    // it, in either order in the history: that run may be in its body.
    expect(ddb.commandCalls(UpdateCommand)[0].args[0].input.ConditionExpression).toBe(
      state === STATE.holdForRate ? ACQUIRE_WITH_BODY_SLOT_CONDITION : ACQUIRE_CONDITION,
    );
  });

  test('stops it when every permit is taken', async () => {
    history('r2', 'Do Work');
    ddb.on(UpdateCommand).rejects(conditionFailed());

    const result = await guard(redriven('r2'));

    expect(result.action).toBe('stopped');
    // Full: three tries, each refused by the condition (it holds no entry, or it would have been a ValidationException).
    expect(ddb.commandCalls(UpdateCommand).map((c) => c.args[0].input.ConditionExpression)).toEqual(Array(3).fill(ACQUIRE_WITH_BODY_SLOT_CONDITION));
    expect(sfn.commandCalls(StopExecutionCommand)[0].args[0].input).toMatchObject({
      executionArn: exec('r2'),
      error: 'SemaphoreRedriveRejected',
      cause: expect.stringContaining("Redriven at 'Do Work'"),
    });
  });

  test('claims the entry for its run when it still holds its permit, so that nothing that judged the old run frees it', async () => {
    history('r3', 'Do Work');
    ddb.on(UpdateCommand, { ConditionExpression: ACQUIRE_WITH_BODY_SLOT_CONDITION }).rejects(ownEntry());
    ddb.on(UpdateCommand, { ConditionExpression: CLAIM_CONDITION }).resolves({});

    expect((await guard(redriven('r3'))).action).toBe('still holds its permit');
    const claim = ddb.commandCalls(UpdateCommand)[1].args[0].input;
    expect(claim).toMatchObject({
      // A new acquire time and run: a sweep that read the old entry, or a late cleanup of the run
      // before the redrive, leaves it alone; claimed, so a releaser that handed it over never takes it back.
      UpdateExpression: CLAIM_UPDATE,
      ExpressionAttributeNames: { '#holder': key('r3') },
      ExpressionAttributeValues: { ':acquiredAt': expect.stringMatching(/^\d{4}-\d\d-\d\dT/), ':redriveCount': 1, ':claimed': true },
    });
    expect(sfn.commandCalls(StopExecutionCommand)).toHaveLength(0);
  });

  test('claims an entry without a body slot (a stale ticket handed it one) only with a free slot, taken in the same write', async () => {
    history('r4', 'Do Work');
    ddb.on(UpdateCommand, { ConditionExpression: ACQUIRE_WITH_BODY_SLOT_CONDITION }).rejects(ownEntry());
    ddb.on(UpdateCommand, { ConditionExpression: BODY_SLOT_AND_PERMIT_HELD_CONDITION }).rejects(conditionFailed());
    ddb.on(UpdateCommand, { ConditionExpression: CLAIM_WITH_BODY_SLOT_CONDITION }).resolves({});

    expect((await guard(redriven('r4'))).action).toBe('still holds its permit');
    const calls = ddb.commandCalls(UpdateCommand).map((c) => c.args[0].input);
    const conditions = calls.map((c) => c.ConditionExpression);
    expect(conditions).toEqual([ACQUIRE_WITH_BODY_SLOT_CONDITION, BODY_SLOT_AND_PERMIT_HELD_CONDITION, CLAIM_WITH_BODY_SLOT_CONDITION]);
    expect(calls[2]).toMatchObject({
      UpdateExpression: CLAIM_WITH_BODY_SLOT_UPDATE,
      ExpressionAttributeNames: { '#holder': key('r4'), '#bodies': 'bodiesRunning', '#bodyLimit': 'bodyLimit' },
      ExpressionAttributeValues: { ':redriveCount': 1, ':claimed': true },
    });
  });

  test('takes a permit into an entry that keeps a body slot and no permit (its interval passed), in one write that keeps the slot', async () => {
    // A concurrency limit above the rate's count: the run before gave its permit back at the interval.
    history('r5', 'Do Work');
    ddb.on(UpdateCommand, { ConditionExpression: ACQUIRE_WITH_BODY_SLOT_CONDITION }).rejects(ownEntry());
    ddb.on(UpdateCommand, { ConditionExpression: BODY_SLOT_AND_PERMIT_HELD_CONDITION }).rejects(conditionFailed());
    ddb.on(UpdateCommand, { ConditionExpression: CLAIM_WITH_BODY_SLOT_CONDITION }).rejects(conditionFailed());
    ddb.on(UpdateCommand, { ConditionExpression: RETAKE_PERMIT_IN_SLOT_CONDITION }).resolves({});

    expect((await guard(redriven('r5'))).action).toBe('permit taken again');
    const calls = ddb.commandCalls(UpdateCommand).map((c) => c.args[0].input);
    expect(calls.map((c) => c.ConditionExpression)).toEqual([
      ACQUIRE_WITH_BODY_SLOT_CONDITION,
      BODY_SLOT_AND_PERMIT_HELD_CONDITION,
      CLAIM_WITH_BODY_SLOT_CONDITION,
      RETAKE_PERMIT_IN_SLOT_CONDITION,
    ]);
    // Under the limit read from the input, for this run or an earlier one's entry, claimed for this run.
    // Exactly the names and values the two expressions use: DynamoDB rejects any other.
    expect(calls[3].UpdateExpression).toBe(RETAKE_PERMIT_IN_SLOT_UPDATE);
    expect(calls[3].ExpressionAttributeNames).toEqual({ '#holder': key('r5'), '#permits': 'permitsInUse', '#fence': 'fencingToken', '#collecting': 'collecting' });
    expect(calls[3].ExpressionAttributeValues).toEqual({
      ':limit': 2,
      ':redriveCount': 1,
      ':claimed': true,
      ':acquiredAt': expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
      ':zero': 0,
      ':one': 1,
    });
    expect(sfn.commandCalls(StopExecutionCommand)).toHaveLength(0);
  });

  test('stops the run when every permit stays taken beside its entry of no permit, and leaves the entry (and its slot) to the cleanup', async () => {
    history('r5b', 'Do Work');
    ddb.on(UpdateCommand).rejects(conditionFailed());
    ddb.on(UpdateCommand, { ConditionExpression: ACQUIRE_WITH_BODY_SLOT_CONDITION }).rejects(ownEntry());

    expect((await guard(redriven('r5b'))).action).toBe('stopped');
    const conditions = ddb.commandCalls(UpdateCommand).map((c) => c.args[0].input.ConditionExpression);
    // Three tries of four writes, none of which removes the entry.
    expect(conditions).toEqual(
      Array(3)
        .fill([ACQUIRE_WITH_BODY_SLOT_CONDITION, BODY_SLOT_AND_PERMIT_HELD_CONDITION, CLAIM_WITH_BODY_SLOT_CONDITION])
        .map((tries) => [...tries, RETAKE_PERMIT_IN_SLOT_CONDITION])
        .flat(),
    );
    expect(sfn.commandCalls(StopExecutionCommand)[0].args[0].input).toMatchObject({ executionArn: exec('r5b'), error: 'SemaphoreRedriveRejected' });
  });

  test('leaves an execution redriven outside the body to the workflow (before it, its acquire claims a late entry itself)', async () => {
    for (const [name, state] of [['r4', 'Release Permit'], ['r6', 'Poll For Permit']]) {
      history(name, state);
      expect((await guard(redriven(name))).action).toBe('outside the body');
    }
    expect(ddb.commandCalls(UpdateCommand)).toHaveLength(0);
    expect(sfn.commandCalls(StopExecutionCommand)).toHaveLength(0);
  });

  test('does nothing for an execution that stopped again before the event arrived', async () => {
    history('r7', 'Do Work', 'SUCCEEDED');
    expect((await guard(redriven('r7'))).action).toBe('no longer running');
    expect(ddb.commandCalls(UpdateCommand)).toHaveLength(0);
    expect(sfn.commandCalls(StopExecutionCommand)).toHaveLength(0);
  });

  test('gives back a permit it took for an execution that finished meanwhile', async () => {
    history('r8', 'Do Work');
    sfn
      .on(DescribeExecutionCommand, { executionArn: exec('r8') })
      .resolvesOnce({ status: 'RUNNING', redriveCount: 1 })
      .resolves({ status: 'SUCCEEDED', redriveCount: 1 });
    ddb.on(UpdateCommand).resolves({});

    expect((await guard(redriven('r8'))).action).toBe('permit taken again, then given back');
    const [take, giveBack] = ddb.commandCalls(UpdateCommand).map((c) => c.args[0].input);
    expect(giveBack).toMatchObject({
      ConditionExpression: RELEASE_SEEN_HOLDER_CONDITION,
      ExpressionAttributeValues: { ':acquiredAt': (take.ExpressionAttributeValues as any)[':entry'][HOLDER_ACQUIRED_AT], ':redriveCount': 1 },
    });
  });

  test('hands the permit it gave back to the oldest waiter and wakes it, as a release would', async () => {
    history('r8', 'Do Work');
    sfn
      .on(DescribeExecutionCommand, { executionArn: exec('r8') })
      .resolvesOnce({ status: 'RUNNING', redriveCount: 1 })
      .resolves({ status: 'SUCCEEDED', redriveCount: 1 });
    statuses({ [exec('waiter')]: 'RUNNING' });
    sfn.on(SendTaskSuccessCommand).resolves({});
    ddb.on(UpdateCommand).resolves({});
    // The lock after the give-back: a permit free, ticket 4 waiting (then, once admitted, nobody).
    const lock = { lockName: { S: 'db' }, permitsInUse: { N: '1' }, concurrencyLimit: { N: '2' }, fencingToken: { N: '7' }, queueHead: { N: '3' } };
    raw
      .on(GetItemCommand, { Key: { lockName: { S: 'db' } } })
      .resolvesOnce({ Item: { ...lock, queueTail: { N: '4' } } })
      .resolves({ Item: { ...lock, queueHead: { N: '4' }, queueTail: { N: '4' } } });
    const ticket = { lockName: { S: ticketKey('db', 4) }, [TICKET_WAITER]: { S: exec('waiter') }, [HOLDER_REDRIVE_COUNT]: { N: '0' }, [TICKET_WAIT_TOKEN]: { S: 'token-4' } };
    raw.on(GetItemCommand, { Key: { lockName: { S: ticketKey('db', 4) } } }).resolves({ Item: ticket });
    raw.on(UpdateItemCommand).callsFake((input) => (input.ReturnValues === 'ALL_NEW' ? { Attributes: { ...ticket, [TICKET_SERVED_BY]: input.ExpressionAttributeValues[':servedBy'] } } : {}));

    expect((await guard(redriven('r8'))).action).toBe('permit taken again, then given back');
    expect(sfn.commandCalls(SendTaskSuccessCommand).map((c) => c.args[0].input)).toEqual([{ taskToken: 'token-4', output: JSON.stringify({ fencingToken: 8 }) }]);
    const admit = raw.commandCalls(UpdateItemCommand).map((c) => c.args[0].input).find((i) => i.Key!.lockName.S === 'db')!;
    expect(admit.ExpressionAttributeNames!['#next']).toBe(exec('waiter'));
    expect(admit.ExpressionAttributeValues).toMatchObject({ ':permits': { N: '1' }, ':permitsAfter': { N: '2' }, ':head': { N: '3' }, ':nextTicket': { N: '4' } });
    expect(raw.commandCalls(DeleteItemCommand).map((c) => c.args[0].input.Key)).toEqual([{ lockName: { S: ticketKey('db', 4) } }]);
  });

  test('leaves the queue alone when it gave nothing back (the holder was gone meanwhile)', async () => {
    history('r8', 'Do Work');
    sfn
      .on(DescribeExecutionCommand, { executionArn: exec('r8') })
      .resolvesOnce({ status: 'RUNNING', redriveCount: 1 })
      .resolves({ status: 'SUCCEEDED', redriveCount: 1 });
    ddb.on(UpdateCommand).resolvesOnce({}).rejects(conditionFailed());

    expect((await guard(redriven('r8'))).action).toBe('permit taken again, then given back');
    expect(raw.commandCalls(GetItemCommand)).toHaveLength(0);
  });

  test('weighted: gives back what is left of an entry being handed on, and when it then cannot take the whole weight, stops the run and serves the queue', async () => {
    process.env.PERMITS = '2';
    try {
      history('r9', 'Do Work');
      ddb.on(UpdateCommand, { ConditionExpression: WEIGHTED_ACQUIRE_CONDITION }).rejectsOnce(ownEntry()).rejects(conditionFailed());
      ddb.on(UpdateCommand, { ConditionExpression: WEIGHTED_CLAIM_CONDITION }).rejects(conditionFailed());
      ddb.on(UpdateCommand, { ConditionExpression: RELEASE_PARTIAL_CONDITION }).resolves({});

      expect((await guard(redriven('r9'))).action).toBe('stopped');
      expect(ddb.commandCalls(UpdateCommand).map((c) => c.args[0].input.ConditionExpression)).toEqual([
        WEIGHTED_ACQUIRE_CONDITION,
        WEIGHTED_CLAIM_CONDITION,
        RELEASE_PARTIAL_CONDITION,
        WEIGHTED_ACQUIRE_CONDITION,
        WEIGHTED_ACQUIRE_CONDITION,
      ]);
      expect(sfn.commandCalls(StopExecutionCommand)).toHaveLength(1);
      // The permits it gave back: the queue's service reads the lock (nobody waits in this mock).
      expect(raw.commandCalls(GetItemCommand).map((c) => c.args[0].input)).toEqual([
        { TableName: 'locks', Key: { lockName: { S: 'db' } }, ConsistentRead: true },
      ]);
    } finally {
      delete process.env.PERMITS;
    }
  });

  test('F4: fails (so that Lambda invokes it again) on a description or a history that does not show the redrive yet', async () => {
    // A stale description: still run 0.
    statuses({ [exec('s1')]: 'FAILED' }, 0);
    await expect(guard(redriven('s1'))).rejects.toMatchObject({ name: 'RedriveUndecided' });
    // The description shows run 1, the history not yet.
    statuses({ [exec('s2')]: 'RUNNING' }, 1);
    sfn.on(GetExecutionHistoryCommand, { executionArn: exec('s2') }).resolves({
      events: [{ id: 5, timestamp: new Date(), type: 'TaskStateEntered', stateEnteredEventDetails: { name: 'Do Work' } }],
    });
    await expect(guard(redriven('s2'))).rejects.toMatchObject({ name: 'RedriveUndecided' });
    expect(ddb.commandCalls(UpdateCommand)).toHaveLength(0);
    expect(sfn.commandCalls(StopExecutionCommand)).toHaveLength(0);
  });

  test('F4: past its patience, stops an execution it still cannot judge', async () => {
    statuses({ [exec('s3')]: 'RUNNING' }, 0);
    const longAgo = new Date(Date.now() - GUARD_PATIENCE_MS - 1_000);

    expect((await guard(redriven('s3', undefined, longAgo))).action).toBe('stopped, unverified');
    expect(sfn.commandCalls(StopExecutionCommand)[0].args[0].input).toMatchObject({ executionArn: exec('s3'), error: 'SemaphoreRedriveUnverified' });
  });

  test('F4: each sweep guards the redriven executions that still run, in case their event was lost', async () => {
    process.env.STATE_MACHINE_ARNS = SM;
    ddb.on(ScanCommand).resolves({ Items: [] });
    sfn.on(ListExecutionsCommand).resolves({ executions: [{ executionArn: exec('b1'), redriveCount: 1 } as any] });
    history('b1', 'Do Work');
    ddb.on(UpdateCommand).resolves({});

    const result = await sweep({});

    expect(sfn.commandCalls(ListExecutionsCommand)[0].args[0].input).toMatchObject({ stateMachineArn: SM, statusFilter: 'RUNNING', redriveFilter: 'REDRIVEN' });
    expect(result.redriven).toEqual([{ executionArn: exec('b1'), resumedAt: 'Do Work', action: 'permit taken again' }]);
    expect(ddb.commandCalls(UpdateCommand)[0].args[0].input.ConditionExpression).toBe(ACQUIRE_WITH_BODY_SLOT_CONDITION);
  });

  test('reads a runtime lock name from the execution input', async () => {
    delete process.env.LOCK_NAME;
    process.env.LOCK_NAME_PATH = '$.tenant';
    history('r5', 'Do Work');
    ddb.on(UpdateCommand).resolves({});

    await guard(redriven('r5', { tenant: 'globex' }));

    expect(ddb.commandCalls(UpdateCommand)[0].args[0].input.Key).toEqual({ lockName: 'globex' });
  });

  test("ignores other state machines' executions", async () => {
    const result = await guard({ 'detail-type': 'Step Functions Execution Status Change', 'detail': { executionArn: exec('x', 'Other'), status: 'RUNNING' } });
    expect(result.action).toBe('not ours');
    expect(sfn.commandCalls(GetExecutionHistoryCommand)).toHaveLength(0);
  });
});
