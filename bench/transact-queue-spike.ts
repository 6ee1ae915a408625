import { Duration, RemovalPolicy, Token } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { LockLayout } from '../simulator';
import { THROTTLING_ERRORS, transientRetry } from '../src/private/dynamodb-errors';
import { ownHolderKey } from '../src/private/lock-tasks';
import { SDK_THROTTLING_ERRORS } from '../src/private/queue-states';

/*
 * A design spike for issue 15's contended target (8 transitions and 6 DynamoDB calls per execution at
 * 100 on limit 5), run by `npm run bench -- --spike transact-queue`: not the library.
 *
 * The library's queue pays, per waiter, a Parallel, a ticket on the lock item and the wait on the
 * ticket's item, and its releaser a claim of the next ticket, the serve of its item and the hand-off
 * (docs/design-holder-items.md). This spike asks what a queue costs that enqueues in one write and finds
 * its next waiter by a read:
 *
 * - One table with a sort key: the lock item (sort key `#lock`: the count, the holders as today, the
 *   fencing counter and the number of waiters) and a ticket item per waiter (sort key `t#<time>#<name>`:
 *   the waiter and its task token), all under the lock's name as partition key, so that they share one
 *   partition and its 1,000 write units a second.
 * - The wait is one `TransactWriteItems.waitForTaskToken`: the waiters' count on the lock item (on
 *   condition that the lock is full) and the ticket item. Cancelled (a permit came free), it acquires again.
 * - A release refused because someone waits reads the lock item and the oldest ticket in one strongly
 *   consistent `Query` (Limit 2), and hands off in one transaction: the entry moves to the waiter, the
 *   fencing counter goes on from the value read (on condition that it is still that value), the count of
 *   waiters goes down and the ticket item goes. Cancelled (another releaser served that ticket, or a grant
 *   moved the counter, or there was no ticket), it releases again. Then `SendTaskSuccess`.
 *
 * A waiter: 1 transition and 1 call (the wait) beside the uncontended path, no Parallel (its wait keeps
 * nothing in the state data). A hand-off: 3 transitions beside the refused release (query, hand off,
 * wake), 2 DynamoDB calls and the wake-up.
 *
 * A transaction cancelled by the partition's limit is tried again after a random pause of 1 to 4 s; one
 * cancelled by a conflict (a transaction under way on the lock item: `--transaction-millis`) at once, by
 * the acquire or the release it goes back to, whose single write of the lock item, refused while a
 * transaction is under way (TransactionConflictException), is tried again as throttling is.
 *
 * It measures cost and drain, not correctness under faults: no cleanup of stopped executions, no redrive
 * guard, no lost wake-ups or responses, no budget on its loops, no acquire timeout; a failed body
 * releases as a successful one does. Tickets are ordered by the time the wait was entered, not by a
 * counter: first come, first served to the millisecond.
 */

export interface TransactQueueSpikeProps {
  readonly body: sfn.IChainable;
  readonly lockName: string;
  readonly limit: number;
}

const KEY = 'pk';
const SORT = 'sk';
/** The lock item's sort key: before every ticket's (`#` sorts before `t`). */
const LOCK_SORT = '#lock';
const TICKET_PREFIX = 't#';
const COUNT = 'permitsInUse';
/** What the lock item's placeholder waiter is called (see Find Next Waiter). */
const NO_WAITER = 'none';

/** The spike's lock items, for the simulator's lock monitor: the item of sort key `#lock`, holders as the library's. */
export const TRANSACT_QUEUE_LAYOUT: LockLayout = {
  key: KEY,
  count: COUNT,
  isHolder: (_name, value) => value.M?.a !== undefined,
  isLockItem: (item) => item[SORT]?.S === LOCK_SORT,
};

export const TRANSACT_QUEUE_STATES = {
  acquire: 'Acquire Permit',
  body: 'Run Protected Body',
  release: 'Release Permit',
} as const;

export class TransactQueueSpike extends Construct {
  public readonly table: dynamodb.Table;
  public readonly stateMachine: sfn.StateMachine;

  constructor(scope: Construct, id: string, props: TransactQueueSpikeProps) {
    super(scope, id);
    const table = new dynamodb.Table(this, 'Locks', {
      partitionKey: { name: KEY, type: dynamodb.AttributeType.STRING },
      sortKey: { name: SORT, type: dynamodb.AttributeType.STRING },
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      removalPolicy: RemovalPolicy.DESTROY,
    });
    this.table = table;
    // Holders as the library's: the same id (the state machine's hash and the execution's name) and entry
    // fields (acquired at, run; a hand-off's id), so that the lock item is as large as the library's.
    const me = ownHolderKey();
    const entry = (handoff?: string) =>
      tasks.DynamoAttributeValue.fromMap({
        a: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
        r: tasks.DynamoAttributeValue.numberFromString(sfn.JsonPath.format('{}', sfn.JsonPath.stringAt('$$.Execution.RedriveCount'))),
        ...(handoff ? { h: tasks.DynamoAttributeValue.fromString(handoff) } : {}),
      });
    // The lock item's key, for the optimized integration's tasks and for the AWS SDK's.
    const lockItemKey = { [KEY]: tasks.DynamoAttributeValue.fromString(props.lockName), [SORT]: tasks.DynamoAttributeValue.fromString(LOCK_SORT) };
    const lockKey = { [KEY]: lockItemKey[KEY].toObject(), [SORT]: lockItemKey[SORT].toObject() };
    const names = { '#count': COUNT, '#me': me, '#fence': 'fence', '#waiters': 'waiters', '#waiter': 'waiter' };
    const num = (n: number) => tasks.DynamoAttributeValue.fromNumber(n);
    // A single write of the lock item while a transaction is under way on it is refused
    // (TransactionConflictException, with `--transaction-millis`): tried again as throttling is.
    const retry = transientRetry([...THROTTLING_ERRORS, 'DynamoDB.TransactionConflictException']);
    const sdkRetry = transientRetry(SDK_THROTTLING_ERRORS);
    const cancelled = ['DynamoDb.TransactionCanceledException', 'DynamoDb.DynamoDbException'];

    const acquire = new tasks.DynamoUpdateItem(this, TRANSACT_QUEUE_STATES.acquire, {
      table,
      key: lockItemKey,
      conditionExpression: '(attribute_not_exists(#count) OR #count < :limit) AND attribute_not_exists(#me)',
      // The waiters' count and the placeholder waiter (what a query without a ticket hands off to: see below) once.
      updateExpression:
        'SET #count = if_not_exists(#count, :zero) + :one, #fence = if_not_exists(#fence, :zero) + :one, ' +
        '#waiters = if_not_exists(#waiters, :zero), #waiter = if_not_exists(#waiter, :none), #me = :entry',
      expressionAttributeNames: names,
      expressionAttributeValues: {
        ':limit': num(props.limit),
        ':zero': num(0),
        ':one': num(1),
        ':none': tasks.DynamoAttributeValue.fromString(NO_WAITER),
        ':entry': entry(),
      },
      resultPath: sfn.JsonPath.DISCARD,
    }).addRetry(retry);

    // The wait: the ticket and the count of waiters in one transaction, on condition that the lock is full.
    const waitInQueue = new tasks.CallAwsService(this, 'Wait In Queue', {
      service: 'dynamodb',
      action: 'transactWriteItems',
      integrationPattern: sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
      parameters: {
        TransactItems: [
          {
            Update: {
              TableName: table.tableName,
              Key: lockKey,
              ConditionExpression: '#count >= :limit AND attribute_not_exists(#me)',
              UpdateExpression: 'SET #waiters = #waiters + :one',
              ExpressionAttributeNames: { '#count': COUNT, '#me': me, '#waiters': 'waiters' },
              ExpressionAttributeValues: { ':limit': { N: String(props.limit) }, ':one': { N: '1' } },
            },
          },
          {
            Put: {
              TableName: table.tableName,
              Item: {
                [KEY]: { S: props.lockName },
                [SORT]: { S: sfn.JsonPath.format(`${TICKET_PREFIX}{}#{}`, sfn.JsonPath.stringAt('$$.State.EnteredTime'), sfn.JsonPath.executionName) },
                waiter: { S: me },
                token: { S: sfn.JsonPath.taskToken },
              },
              ConditionExpression: `attribute_not_exists(${KEY})`,
            },
          },
        ],
      },
      iamResources: [table.tableArn],
      taskTimeout: sfn.Timeout.duration(Duration.days(1)),
      resultPath: sfn.JsonPath.DISCARD,
    });

    const body = new sfn.Parallel(this, TRANSACT_QUEUE_STATES.body, { resultPath: sfn.JsonPath.DISCARD }).branch(props.body);
    const release = new tasks.DynamoUpdateItem(this, TRANSACT_QUEUE_STATES.release, {
      table,
      key: lockItemKey,
      conditionExpression: 'attribute_exists(#me) AND #waiters = :zero',
      updateExpression: 'SET #count = #count - :one REMOVE #me',
      expressionAttributeNames: { '#count': COUNT, '#me': me, '#waiters': 'waiters' },
      expressionAttributeValues: { ':zero': num(0), ':one': num(1) },
      resultPath: sfn.JsonPath.DISCARD,
    }).addRetry(retry);

    // The lock item and the oldest ticket, in one strongly consistent read. `next` is the last item read:
    // the ticket, or the lock item itself when no ticket is left (its placeholder waiter makes the hand-off
    // a transaction of two actions on one item, which DynamoDB refuses: the release is tried again).
    const findNext = new tasks.CallAwsService(this, 'Find Next Waiter', {
      service: 'dynamodb',
      action: 'query',
      parameters: {
        TableName: table.tableName,
        KeyConditionExpression: `${KEY} = :lock`,
        ExpressionAttributeValues: { ':lock': { S: props.lockName } },
        ConsistentRead: true,
        Limit: 2,
      },
      iamResources: [table.tableArn],
      resultSelector: {
        lock: sfn.JsonPath.objectAt('$.Items[0]'),
        next: sfn.JsonPath.objectAt('$.Items[-1:]'),
        wake: { fencingToken: sfn.JsonPath.mathAdd(Token.asNumber(sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt('$.Items[0].fence.N'))), 1) },
      },
      resultPath: '$.q',
    }).addRetry(sdkRetry);

    const handOff = new tasks.CallAwsService(this, 'Hand Off Permit', {
      service: 'dynamodb',
      action: 'transactWriteItems',
      parameters: {
        TransactItems: [
          {
            Update: {
              TableName: table.tableName,
              Key: lockKey,
              ConditionExpression: 'attribute_exists(#me) AND #fence = :seen',
              UpdateExpression: 'REMOVE #me SET #next = :entry, #fence = :token, #waiters = #waiters - :one',
              ExpressionAttributeNames: { '#me': me, '#next': sfn.JsonPath.stringAt('$.q.next[0].waiter.S'), '#fence': 'fence', '#waiters': 'waiters' },
              ExpressionAttributeValues: {
                ':seen': { N: sfn.JsonPath.stringAt('$.q.lock.fence.N') },
                ':token': { N: sfn.JsonPath.format('{}', sfn.JsonPath.stringAt('$.q.wake.fencingToken')) },
                ':entry': entry(sfn.JsonPath.format('{}/{}', sfn.JsonPath.stringAt('$.q.wake.fencingToken'), sfn.JsonPath.stringAt('$$.Execution.RedriveCount'))).toObject(),
                ':one': { N: '1' },
              },
            },
          },
          {
            Delete: {
              TableName: table.tableName,
              Key: { [KEY]: { S: props.lockName }, [SORT]: { S: sfn.JsonPath.stringAt('$.q.next[0].sk.S') } },
              ConditionExpression: `attribute_exists(${KEY})`,
            },
          },
        ],
      },
      iamResources: [table.tableArn],
      resultPath: sfn.JsonPath.DISCARD,
    });
    const wake = new tasks.CallAwsService(this, 'Wake Next Waiter', {
      service: 'sfn',
      action: 'sendTaskSuccess',
      parameters: { TaskToken: sfn.JsonPath.stringAt('$.q.next[0].token.S'), Output: sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$.q.wake')) },
      iamResources: ['*'],
      resultPath: sfn.JsonPath.DISCARD,
    });

    acquire.addCatch(waitInQueue, { errors: ['DynamoDB.ConditionalCheckFailedException'], resultPath: sfn.JsonPath.DISCARD });
    acquire.next(body);
    // A transaction the partition's limit cancelled (a ThrottlingError reason, which Step Functions shows
    // only in the cause) is tried again after a random pause of 1 to 4 s, not at once, so that the waiters'
    // and releasers' tries do not keep the partition over its limit. Three transitions, on that path only.
    const afterThrottling = (stateId: string, next: sfn.State) => {
      const pause = new sfn.Wait(this, `${stateId} Backs Off`, { time: sfn.WaitTime.secondsPath('$.backOff.seconds') }).next(next);
      const draw = new sfn.Pass(this, `${stateId} Draws Its Pause`, { parameters: { 'seconds.$': 'States.MathRandom(1, 5)' }, resultPath: '$.backOff' }).next(pause);
      return new sfn.Choice(this, `${stateId} Throttled?`).when(sfn.Condition.stringMatches('$.cancelled.Cause', '*ThrottlingError*'), draw).otherwise(next);
    };
    waitInQueue.addCatch(afterThrottling('Wait In Queue', acquire), { errors: cancelled, resultPath: '$.cancelled' });
    waitInQueue.next(body);
    body.addCatch(release, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD });
    body.next(release);
    release.addCatch(findNext, { errors: ['DynamoDB.ConditionalCheckFailedException'], resultPath: sfn.JsonPath.DISCARD });
    findNext.next(handOff);
    handOff.addCatch(afterThrottling('Hand Off', release), { errors: cancelled, resultPath: '$.cancelled' });
    handOff.next(wake);

    this.stateMachine = new sfn.StateMachine(this, 'StateMachine', { definitionBody: sfn.DefinitionBody.fromChainable(acquire) });
  }
}
