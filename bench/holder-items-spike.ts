import { Duration, RemovalPolicy } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { LockLayout } from '../simulator';
import { transientRetry } from '../src/private/dynamodb-errors';

/*
 * A design spike for issue 15's open targets, run by `npm run bench -- --spike`: not the library.
 *
 * The layout: holders in items of their own (key `<lock>#<execution name>`), and the lock item only a
 * counter, so that its size no longer grows with the limit. Acquire and release are TransactWriteItems
 * of two items (the counter, conditional on the limit, and the holder item), 2 write units each on
 * items under 1 KB, whatever the limit: 4 per acquire, 4 per release, 4 per refused attempt (a
 * cancelled transaction is billed by its items as they are). Waiters poll, every `pollInterval` after
 * a random first delay, as the library's polling strategy does.
 *
 * It measures what that layout costs and how fast a hot lock drains, not whether it is correct under
 * faults: it has no cleanup of stopped executions, no redrive guard, no fencing token, and a retried
 * acquire whose first attempt landed would find its own holder item and poll until its timeout. The
 * library's queue, moved onto this layout, would replace the polls with tickets.
 */

export interface HolderItemsSpikeProps {
  readonly body: sfn.IChainable;
  readonly lockName: string;
  readonly limit: number;
  /** @default 3 seconds */
  readonly pollInterval?: Duration;
}

/** Separates a holder item's lock name from its execution name. */
const HOLDER_SEPARATOR = '#';
const COUNT = 'permitsInUse';
const KEY = 'pk';

/** The spike's items, for the simulator's lock monitor. */
export const HOLDER_ITEMS_LAYOUT: LockLayout = {
  key: KEY,
  count: COUNT,
  isHolder: () => false,
  holderItemOf: (key) => (key.includes(HOLDER_SEPARATOR) ? key.slice(0, key.indexOf(HOLDER_SEPARATOR)) : undefined),
};

export const SPIKE_STATES = {
  acquire: 'Acquire Permit',
  poll: 'Poll For Permit',
  body: 'Run Protected Body',
  release: 'Release Permit',
  releaseAfterFailure: 'Release Permit After Failure',
} as const;

export class HolderItemsSpike extends Construct {
  public readonly table: dynamodb.Table;
  public readonly stateMachine: sfn.StateMachine;

  constructor(scope: Construct, id: string, props: HolderItemsSpikeProps) {
    super(scope, id);
    this.table = new dynamodb.Table(this, 'Locks', {
      partitionKey: { name: KEY, type: dynamodb.AttributeType.STRING },
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      removalPolicy: RemovalPolicy.DESTROY,
    });
    const table = this.table;
    const holderKey = { S: sfn.JsonPath.format(`${props.lockName}${HOLDER_SEPARATOR}{}`, sfn.JsonPath.stringAt('$$.Execution.Name')) };
    const lockKey = { [KEY]: { S: props.lockName } };
    const transact = (stateId: string, items: unknown[]) =>
      new tasks.CallAwsService(this, stateId, {
        service: 'dynamodb',
        action: 'transactWriteItems',
        parameters: { TransactItems: items },
        iamResources: [table.tableArn],
        resultPath: sfn.JsonPath.DISCARD,
      }).addRetry(transientRetry(['DynamoDb.ProvisionedThroughputExceededException', 'DynamoDb.InternalServerErrorException']));
    const take = () => [
      {
        Update: {
          TableName: table.tableName,
          Key: lockKey,
          ConditionExpression: 'attribute_not_exists(#count) OR #count < :limit',
          UpdateExpression: 'SET #count = if_not_exists(#count, :zero) + :one',
          ExpressionAttributeNames: { '#count': COUNT },
          ExpressionAttributeValues: { ':limit': { N: String(props.limit) }, ':zero': { N: '0' }, ':one': { N: '1' } },
        },
      },
      {
        Put: {
          TableName: table.tableName,
          Item: { [KEY]: holderKey, acquiredAt: { S: sfn.JsonPath.stringAt('$$.State.EnteredTime') } },
          ConditionExpression: `attribute_not_exists(${KEY})`,
        },
      },
    ];
    const giveBack = [
      {
        Update: {
          TableName: table.tableName,
          Key: lockKey,
          ConditionExpression: '#count > :zero',
          UpdateExpression: 'SET #count = #count - :one',
          ExpressionAttributeNames: { '#count': COUNT },
          ExpressionAttributeValues: { ':zero': { N: '0' }, ':one': { N: '1' } },
        },
      },
      { Delete: { TableName: table.tableName, Key: { [KEY]: holderKey }, ConditionExpression: `attribute_exists(${KEY})` } },
    ];
    const cancelled = ['DynamoDb.TransactionCanceledException'];

    // Cancelled: released already, unless a partition over its rate cancelled it (a ThrottlingError
    // reason, which Step Functions shows only in the cause): then it waits a second and tries again.
    // The release itself is the last state.
    const releaseCancelled = (stateId: string, release: sfn.TaskStateBase, done: sfn.State) => {
      const again = new sfn.Wait(this, `${stateId} Throttled`, { time: sfn.WaitTime.duration(Duration.seconds(1)) }).next(release);
      const throttled = new sfn.Choice(this, `${stateId} Cancelled By Throttling?`)
        .when(sfn.Condition.stringMatches('$.releaseError.Cause', '*ThrottlingError*'), again)
        .otherwise(done);
      release.addCatch(throttled, { errors: cancelled, resultPath: '$.releaseError' });
    };
    const release = transact(SPIKE_STATES.release, giveBack);
    releaseCancelled(SPIKE_STATES.release, release, new sfn.Succeed(this, 'Released Already'));
    const failed = new sfn.Fail(this, 'Fail With Original Error', { errorPath: '$.error.Error', causePath: '$.error.Cause' });
    const releaseAfterFailure = transact(SPIKE_STATES.releaseAfterFailure, giveBack);
    releaseCancelled(SPIKE_STATES.releaseAfterFailure, releaseAfterFailure, failed);
    releaseAfterFailure.addCatch(failed, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD });
    releaseAfterFailure.next(failed);
    const body = new sfn.Parallel(this, SPIKE_STATES.body, { resultPath: sfn.JsonPath.DISCARD })
      .branch(props.body)
      .addCatch(releaseAfterFailure, { errors: [sfn.Errors.ALL], resultPath: '$.error' });
    body.next(release);

    const pollSeconds = (props.pollInterval ?? Duration.seconds(3)).toSeconds();
    const poll = transact(SPIKE_STATES.poll, take());
    poll.next(body);
    const waitNext = new sfn.Wait(this, 'Wait Before Next Poll', { time: sfn.WaitTime.duration(Duration.seconds(pollSeconds)) });
    waitNext.next(poll);
    poll.addCatch(waitNext, { errors: cancelled, resultPath: sfn.JsonPath.DISCARD });
    // A random first delay (1 to pollInterval seconds), so that the waiters do not poll in step.
    const draw = new sfn.Pass(this, 'Draw Poll Delay', {
      parameters: { 'seconds.$': `States.MathRandom(1, ${pollSeconds + 1})` },
      resultPath: '$.pollDelay',
    });
    const waitFirst = new sfn.Wait(this, 'Wait Before First Poll', { time: sfn.WaitTime.secondsPath('$.pollDelay.seconds') });
    draw.next(waitFirst).next(poll);
    const acquire = transact(SPIKE_STATES.acquire, take()).addCatch(draw, { errors: cancelled, resultPath: sfn.JsonPath.DISCARD });
    acquire.next(body);

    this.stateMachine = new sfn.StateMachine(this, 'StateMachine', { definitionBody: sfn.DefinitionBody.fromChainable(acquire) });
  }
}
