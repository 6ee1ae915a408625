import { Duration, RemovalPolicy } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';

/*
 * The peer we measure ourselves against: the AWS sample "control concurrency with a DynamoDB
 * semaphore" (aws-samples/aws-stepfunctions-examples, sam/app-control-concurrency-with-dynamodb),
 * rebuilt here with CDK constructs following its published algorithm (../shared/anchors/), so that
 * both run in the same simulator, with the same seeds, bodies and faults.
 *
 * Its algorithm, weaknesses included (they are what we measure):
 * - acquire: `currentlockcount <> :limit` (not `<`), and ConditionalCheckFailed retried as an error,
 *   6 times with backoff 2 (1+2+4+...+32 s), before a GetItem, a Choice and a fixed 3 s wait;
 * - the first use of a lock fails the acquire on the missing counter, then initializes the item;
 * - no catch around the work: a failed body fails the execution, and only the status-change event
 *   frees its permit (one-shot cleanup: GetItem, Choice, conditional UpdateItem);
 * - throttling that outlasts the retries fails the execution.
 */

export interface AwsSampleSemaphoreProps {
  readonly body: sfn.IChainable;
  readonly lockName: string;
  readonly limit: number;
}

export class AwsSampleSemaphore extends Construct {
  public readonly table: dynamodb.Table;
  public readonly stateMachine: sfn.StateMachine;
  public readonly cleanupStateMachine: sfn.StateMachine;

  constructor(scope: Construct, id: string, props: AwsSampleSemaphoreProps) {
    super(scope, id);
    this.table = new dynamodb.Table(this, 'TableSemaphore', {
      partitionKey: { name: 'LockName', type: dynamodb.AttributeType.STRING },
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      removalPolicy: RemovalPolicy.DESTROY,
    });
    const lockKey = { LockName: tasks.DynamoAttributeValue.fromString(props.lockName) };
    const itemString = sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$.Item'));
    const heldCondition = (path: string) =>
      sfn.Condition.and(sfn.Condition.isPresent(path), sfn.Condition.stringMatches(path, '*Z*'));

    // ---- Get Lock (a Parallel with one branch) ----
    const acquire = new tasks.DynamoUpdateItem(this, 'Acquire Lock', {
      table: this.table,
      key: lockKey,
      expressionAttributeNames: { '#currentlockcount': 'currentlockcount', '#lockownerid': sfn.JsonPath.stringAt('$$.Execution.Id') },
      expressionAttributeValues: {
        ':increase': tasks.DynamoAttributeValue.fromNumber(1),
        ':limit': tasks.DynamoAttributeValue.fromNumber(props.limit),
        ':lockacquiredtime': tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$$.State.EnteredTime')),
      },
      updateExpression: 'SET #currentlockcount = #currentlockcount + :increase, #lockownerid = :lockacquiredtime',
      conditionExpression: 'currentlockcount <> :limit and attribute_not_exists(#lockownerid)',
      returnValues: tasks.DynamoReturnValues.UPDATED_NEW,
    });
    const initialize = new tasks.DynamoPutItem(this, 'Initialize Lock Item', {
      table: this.table,
      item: { LockName: tasks.DynamoAttributeValue.fromString(props.lockName), currentlockcount: tasks.DynamoAttributeValue.fromNumber(0) },
      conditionExpression: 'LockName <> :lockname',
      expressionAttributeValues: { ':lockname': tasks.DynamoAttributeValue.fromString(props.lockName) },
      resultPath: sfn.JsonPath.DISCARD,
    });
    const getRecord = new tasks.DynamoGetItem(this, 'Get Current Lock Record', {
      table: this.table,
      key: lockKey,
      expressionAttributeNames: { '#lockownerid': sfn.JsonPath.stringAt('$$.Execution.Id') },
      projectionExpression: [new tasks.DynamoProjectionExpression().withAttribute('#lockownerid')],
      resultSelector: { 'Item.$': '$.Item', 'ItemString': itemString },
      resultPath: '$.lockinfo.currentlockitem',
    });
    const waitToGetLock = new sfn.Wait(this, 'Wait to Get Lock', { time: sfn.WaitTime.duration(Duration.seconds(3)) });
    acquire.addRetry({ errors: ['DynamoDB.AmazonDynamoDBException'], maxAttempts: 0 });
    acquire.addRetry({ errors: [sfn.Errors.ALL], maxAttempts: 6, backoffRate: 2 });
    acquire.addCatch(initialize, { errors: ['DynamoDB.AmazonDynamoDBException'], resultPath: '$.lockinfo.acquisitionerror' });
    acquire.addCatch(getRecord, { errors: ['DynamoDB.ConditionalCheckFailedException'], resultPath: '$.lockinfo.acquisitionerror' });
    initialize.addCatch(acquire, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD });
    initialize.next(acquire);
    getRecord.next(
      new sfn.Choice(this, 'Check If Lock Already Acquired')
        .when(heldCondition('$.lockinfo.currentlockitem.ItemString'), new sfn.Pass(this, 'Continue Because Lock Was Already Acquired'))
        .otherwise(waitToGetLock),
    );
    waitToGetLock.next(acquire);
    const getLock = new sfn.Parallel(this, 'Get Lock', { resultPath: sfn.JsonPath.DISCARD }).branch(acquire);

    // ---- Do Work, Release Lock ----
    const doWork = new sfn.Parallel(this, 'Do Work').branch(props.body);
    const success = new sfn.Succeed(this, 'Success State');
    const release = new tasks.DynamoUpdateItem(this, 'Release Lock', {
      table: this.table,
      key: lockKey,
      expressionAttributeNames: { '#currentlockcount': 'currentlockcount', '#lockownerid': sfn.JsonPath.stringAt('$$.Execution.Id') },
      expressionAttributeValues: { ':decrease': tasks.DynamoAttributeValue.fromNumber(1) },
      updateExpression: 'SET #currentlockcount = #currentlockcount - :decrease REMOVE #lockownerid',
      conditionExpression: 'attribute_exists(#lockownerid)',
      returnValues: tasks.DynamoReturnValues.UPDATED_NEW,
      resultPath: sfn.JsonPath.DISCARD,
    });
    release.addRetry({ errors: ['DynamoDB.ConditionalCheckFailedException'], maxAttempts: 0 });
    release.addRetry({ errors: [sfn.Errors.ALL], maxAttempts: 5, backoffRate: 1.5 });
    release.addCatch(success, { errors: ['DynamoDB.ConditionalCheckFailedException'], resultPath: sfn.JsonPath.DISCARD });
    this.stateMachine = new sfn.StateMachine(this, 'Semaphore', {
      definitionBody: sfn.DefinitionBody.fromChainable(getLock.next(doWork).next(release).next(success)),
    });

    // ---- CleanFromIncomplete ----
    const getItem = new tasks.DynamoGetItem(this, 'Get Current Lock Item', {
      table: this.table,
      key: lockKey,
      expressionAttributeNames: { '#lockownerid': sfn.JsonPath.stringAt('$.detail.executionArn') },
      projectionExpression: [new tasks.DynamoProjectionExpression().withAttribute('#lockownerid')],
      resultSelector: { 'Item.$': '$.Item', 'ItemString': itemString },
      resultPath: '$.lockinfo.currentlockitem',
    });
    getItem.addRetry({ errors: [sfn.Errors.ALL], interval: Duration.seconds(5), maxAttempts: 20, backoffRate: 1.4 });
    const cleanupDone = new sfn.Succeed(this, 'Cleanup Success State');
    const cleanUp = new tasks.DynamoUpdateItem(this, 'Clean Up Lock', {
      table: this.table,
      key: lockKey,
      expressionAttributeNames: { '#currentlockcount': 'currentlockcount', '#lockownerid': sfn.JsonPath.stringAt('$.detail.executionArn') },
      expressionAttributeValues: { ':decrease': tasks.DynamoAttributeValue.fromNumber(1) },
      updateExpression: 'SET #currentlockcount = #currentlockcount - :decrease REMOVE #lockownerid',
      conditionExpression: 'attribute_exists(#lockownerid)',
      returnValues: tasks.DynamoReturnValues.UPDATED_NEW,
      resultPath: sfn.JsonPath.DISCARD,
    });
    cleanUp.addRetry({ errors: ['DynamoDB.ConditionalCheckFailedException'], maxAttempts: 0 });
    cleanUp.addRetry({ errors: [sfn.Errors.ALL], interval: Duration.seconds(5), maxAttempts: 20, backoffRate: 1.4 });
    cleanUp.addCatch(cleanupDone, { errors: ['DynamoDB.ConditionalCheckFailedException'], resultPath: sfn.JsonPath.DISCARD });
    cleanUp.next(cleanupDone);
    this.cleanupStateMachine = new sfn.StateMachine(this, 'CleanFromIncomplete', {
      definitionBody: sfn.DefinitionBody.fromChainable(
        getItem.next(
          new sfn.Choice(this, 'Check If Lock Is Held').when(heldCondition('$.lockinfo.currentlockitem.ItemString'), cleanUp).otherwise(cleanupDone),
        ),
      ),
    });
    new events.Rule(this, 'CleanupRule', {
      eventPattern: {
        source: ['aws.states'],
        detail: { stateMachineArn: [this.stateMachine.stateMachineArn], status: ['FAILED', 'TIMED_OUT', 'ABORTED'] },
      },
      targets: [new targets.SfnStateMachine(this.cleanupStateMachine)],
    });
  }
}
