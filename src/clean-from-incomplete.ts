import { Duration, Token } from 'aws-cdk-lib';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Construct } from 'constructs';
import { executionArnPattern } from './private/arns';
import { defaultDeadLetterQueue } from './private/dead-letter-queue';
import { SERVER_ERRORS, THROTTLING_ERRORS, transientRetry } from './private/dynamodb-errors';
import { LOCK_KEY, LOCK_STRIPE_SEPARATOR } from './private/lock-schema';
import { holderKeyAt } from './private/lock-tasks';
import { HANDOFF_PATH, handOffChain, WAKE_ACTIONS } from './private/queue-states';
import { pathFromParsedInput, stringValue } from './private/runtime-value';
import { stateMachineLogs } from './private/state-machine-defaults';
import { isLockStripeCount, knownWholeSeconds, MAX_LOCK_STRIPES, validateLockName } from './private/validation';
import { grantWakeToRole } from './private/wake-grants';
import { ISemaphoreTable } from './semaphore-table';

/**
 * Properties of a `CleanFromIncomplete`.
 */
export interface CleanFromIncompleteProps {
  /**
   * The table holding the lock.
   */
  readonly table: ISemaphoreTable;

  /**
   * Name of the lock whose permits the protected executions take.
   *
   * A `JsonPath.stringAt('$.path')` reads it from the stopped execution's input, as the protected
   * workflow does.
   */
  readonly lockName: string;

  /**
   * The state machines whose stopped executions may still hold a permit.
   */
  readonly protectedStateMachines: sfn.IStateMachine[];

  /**
   * Queue that receives status-change events the rule could not deliver to the cleanup state machine
   * after all retries. Anything in it is a permit that only the reconciler will free.
   *
   * @default - a new queue, encrypted with SQS-managed keys, TLS enforced, events kept 14 days
   */
  readonly deadLetterQueue?: sqs.IQueue;

  /**
   * How many times EventBridge retries starting the cleanup state machine.
   *
   * @default 185 (the most EventBridge allows)
   */
  readonly retryAttempts?: number;

  /**
   * How long EventBridge keeps retrying an undelivered event.
   *
   * @default Duration.hours(24) (the most EventBridge allows)
   */
  readonly maxEventAge?: Duration;

  /**
   * Logging of the cleanup state machine.
   *
   * @default - a new log group, level ALL, without execution data
   */
  readonly logs?: sfn.LogOptions;

  /**
   * Whether the cleanup state machine sends traces to X-Ray.
   *
   * @default true
   */
  readonly tracingEnabled?: boolean;

  /**
   * Wait so long after a stop before freeing the stopped execution's permit: the protected workflow's
   * `rateLimit` interval, for which every start of its body holds the permit (the body may have started
   * just before the stop). A whole number of seconds, at least 1.
   *
   * @default - no wait: the permit is freed at once
   */
  readonly holdAfterStop?: Duration;

  /**
   * Whether the protected executions may hold more than one permit each (a workflow with `permits`):
   * the release then hands a stopped execution's permits to queued waiters one at a time. Releases
   * give back exactly what the execution held either way; without it, a weighted holder's release
   * hands one permit to the first queued waiter and gives back the rest at once, so the other waiters
   * sleep beside them until their `queueCheckInterval` ends (or a sweep hands them on).
   *
   * @default false
   */
  readonly weightedPermits?: boolean;

  /**
   * How many stripes `lockName` is split into (the protected workflow's `lockStripes`): the permit of a
   * stopped execution is on one of `<lockName>#0` to `<lockName>#<lockStripes - 1>`, which the event does
   * not say, so the cleanup reads each stripe's lock item (a Map) and releases on the one that holds it.
   *
   * @default 1 - one lock, not split
   */
  readonly lockStripes?: number;
}

/**
 * Frees the permit of an execution that ended without giving it back: stopped (ABORTED), timed out
 * (TIMED_OUT) or failed outside the workflow's own catch (FAILED).
 *
 * An EventBridge rule on "Step Functions Execution Status Change" events of the protected state
 * machines starts a small state machine that gives the permit back with one conditional `UpdateItem`,
 * if and only if the stopped execution still holds one, so duplicated events never free a permit twice.
 * It finds the execution's entry under the holder id a `ConcurrencyControlledWorkflow` writes: the MD5
 * of the event's `stateMachineArn`, `:`, the execution's name (from its `executionArn`).
 * The rule's target retries for up to 24 hours and sends what it could not deliver to an encrypted
 * dead-letter queue.
 *
 * EventBridge delivers these events "best effort": a rare lost event leaves its permit held until a
 * later sweep frees it.
 *
 * @see https://docs.aws.amazon.com/step-functions/latest/dg/cw-events.html
 */
export class CleanFromIncomplete extends Construct {
  /**
   * Execution statuses after which a permit may still be held.
   */
  public static readonly STOPPED_STATUSES: string[] = ['FAILED', 'TIMED_OUT', 'ABORTED'];

  /**
   * The state machine that frees the permit.
   */
  public readonly stateMachine: sfn.StateMachine;

  /**
   * The rule that starts it on status-change events.
   */
  public readonly rule: events.Rule;

  /**
   * Where undeliverable events end up.
   */
  public readonly deadLetterQueue: sqs.IQueue;

  constructor(scope: Construct, id: string, props: CleanFromIncompleteProps) {
    super(scope, id);
    validateLockName(props.lockName);
    if (props.protectedStateMachines.length === 0) {
      throw new Error('`protectedStateMachines` must name at least one state machine, got: []');
    }
    const retryAttempts = props.retryAttempts ?? 185;
    if (!Token.isUnresolved(retryAttempts) && (!Number.isInteger(retryAttempts) || retryAttempts < 0 || retryAttempts > 185)) {
      throw new Error(`\`retryAttempts\` must be an integer from 0 to 185, got: ${retryAttempts}`);
    }
    const maxEventAge = props.maxEventAge ?? Duration.hours(24);
    if (props.holdAfterStop) knownWholeSeconds('holdAfterStop', props.holdAfterStop, 1);
    const stripes = props.lockStripes ?? 1;
    if (!isLockStripeCount(stripes)) {
      throw new Error(`\`lockStripes\` must be an integer from 1 to ${MAX_LOCK_STRIPES}, got: ${stripes}`);
    }
    if (stripes > 1 && props.holdAfterStop) {
      throw new Error('`lockStripes` cannot be combined with `holdAfterStop` yet: a rate is counted per lock. Set one of them');
    }

    this.stateMachine = new sfn.StateMachine(this, 'StateMachine', {
      definitionBody: sfn.DefinitionBody.fromChainable(this.renderDefinition(props)),
      logs: stateMachineLogs(this, props.logs),
      tracingEnabled: props.tracingEnabled ?? true,
    });
    // A table encrypted with a customer managed key: the release needs the key too.
    props.table.table.encryptionKey?.grantEncryptDecrypt(this.stateMachine);
    // The release hands the permit on and wakes its waiter, of any queue workflow using the table.
    grantWakeToRole(props.table, this, 'WakeWaitersPolicy', this.stateMachine.role, WAKE_ACTIONS);

    this.deadLetterQueue = props.deadLetterQueue ?? defaultDeadLetterQueue(this);

    this.rule = new events.Rule(this, 'Rule', {
      description: 'Frees the semaphore permit of Step Functions executions that stopped without giving it back',
      eventPattern: {
        source: ['aws.states'],
        detailType: ['Step Functions Execution Status Change'],
        detail: {
          status: CleanFromIncomplete.STOPPED_STATUSES,
          stateMachineArn: props.protectedStateMachines.map((sm) => sm.stateMachineArn),
        },
      },
      targets: [
        new targets.SfnStateMachine(this.stateMachine, {
          deadLetterQueue: this.deadLetterQueue,
          retryAttempts,
          maxEventAge,
        }),
      ],
    });
  }

  private renderDefinition(props: CleanFromIncompleteProps): sfn.IChainable {
    const lockName = stringValue('lockName', props.lockName);
    const notHeld = new sfn.Succeed(this, 'Permit Not Held');

    // Which run of the execution stopped: a late or repeated event of a run before a redrive must not
    // free the permit of the run after it. A release that finds waiters hands the permit to the oldest.
    // `from`: where the event's executionArn, stateMachineArn and redriveCount are (the event's detail,
    // or the state data a Pass state read them into).
    const release = (from: string, lockNameValue: string) => {
      const prepare = new sfn.Pass(this, 'Prepare Release Of Stopped Execution', {
        parameters: { holder: holderKeyAt(`${from}.stateMachineArn`, `${from}.executionArn`), redriveCount: sfn.JsonPath.numberAt(`${from}.redriveCount`) },
        resultPath: HANDOFF_PATH,
      });
      prepare.next(
        handOffChain(this, {
          table: props.table,
          lockName: tasks.DynamoAttributeValue.fromString(lockNameValue),
          lockNameText: lockNameValue,
          suffix: ' Of Stopped Execution',
          alreadyReleased: notHeld,
          weighted: props.weightedPermits,
        }),
      );
      if (!props.holdAfterStop) return prepare;
      // Under a rate limit: the stop may have come just after the body started.
      const hold = new sfn.Wait(this, 'Hold Permit For Rate Interval', { time: sfn.WaitTime.duration(props.holdAfterStop) });
      hold.next(prepare);
      return hold;
    };
    const stripes = props.lockStripes ?? 1;
    const releaseOnStripes = (from: string, lockNameValue: string) =>
      stripes === 1 ? release(from, lockNameValue) : this.releaseOnEachStripe(props.table, from, lockNameValue, stripes, release, notHeld);

    if (lockName.inputPath === undefined) {
      return this.checkEvent(releaseOnStripes('$.detail', lockName.fixed!));
    }

    // The lock name is in the stopped execution's input. The event carries that input as a string
    // unless it was too large for the event (`inputDetails.included` false); then ask Step Functions.
    const lockNamePath = pathFromParsedInput(lockName.inputPath, '$.input');
    const releaseFromInput = releaseOnStripes('$', sfn.JsonPath.stringAt(lockNamePath));
    const checkLockName = new sfn.Choice(this, 'Lock Name In Input?')
      .when(sfn.Condition.isString(lockNamePath), releaseFromInput)
      // The execution could not have taken a permit without a lock name.
      .otherwise(new sfn.Succeed(this, 'No Lock Name In Input'));

    const fromEvent = new sfn.Pass(this, 'Read Input From Event', {
      parameters: {
        executionArn: sfn.JsonPath.stringAt('$.detail.executionArn'),
        stateMachineArn: sfn.JsonPath.stringAt('$.detail.stateMachineArn'),
        redriveCount: sfn.JsonPath.numberAt('$.detail.redriveCount'),
        input: sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt('$.detail.input')),
      },
    });
    const describe = new tasks.CallAwsService(this, 'Describe Stopped Execution', {
      service: 'sfn',
      action: 'describeExecution',
      parameters: { ExecutionArn: sfn.JsonPath.stringAt('$.detail.executionArn') },
      iamAction: 'states:DescribeExecution',
      iamResources: props.protectedStateMachines.map((sm) => executionArnPattern(this, sm)),
      resultSelector: { input: sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt('$.Input')) },
      resultPath: '$.described',
    });
    // The run that stopped is the event's, not the execution's latest (it may have been redriven since).
    const fromDescription = new sfn.Pass(this, 'Read Input From Description', {
      parameters: {
        executionArn: sfn.JsonPath.stringAt('$.detail.executionArn'),
        stateMachineArn: sfn.JsonPath.stringAt('$.detail.stateMachineArn'),
        redriveCount: sfn.JsonPath.numberAt('$.detail.redriveCount'),
        input: sfn.JsonPath.objectAt('$.described.input'),
      },
    });
    // DescribeExecution only reads, so any task failure may be retried.
    describe.addRetry({
      errors: [sfn.Errors.TASKS_FAILED],
      interval: Duration.seconds(2),
      maxAttempts: 5,
      jitterStrategy: sfn.JitterType.FULL,
    });

    // A run whose input is above what DescribeExecution may return to a task (256 KiB with the other
    // fields): the sweep frees its permit, which reads the holders of every lock and needs no input.
    // States.DataLimitExceeded must be named: States.ALL does not catch it.
    describe.addCatch(new sfn.Succeed(this, 'Input Too Large: Left To The Sweep'), {
      errors: ['States.DataLimitExceeded'],
      resultPath: sfn.JsonPath.DISCARD,
    });

    // The event leaves the input out (`input` null, `inputDetails.included` false) above 248 KiB.
    const readInput = describe.next(fromDescription).next(checkLockName);
    return this.checkEvent(
      new sfn.Choice(this, 'Input In Event?')
        .when(sfn.Condition.not(sfn.Condition.isPresent('$.detail.input')), readInput)
        .when(sfn.Condition.not(sfn.Condition.isString('$.detail.input')), readInput)
        .otherwise(fromEvent.next(checkLockName)),
    );
  }

  /**
   * A split lock: the release, in a Map over the stripes (`<lock name>#<n>`), up to 40 at a time (an inline
   * Map's most). The stopped execution held a permit of one stripe at most (it drew one when it started,
   * and the event does not say which), or of none (the workflow's own catch released it before the
   * execution failed, or it stopped before its acquire): a consistent read of each stripe's lock item,
   * only the execution's entry projected, tells which, and only a stripe that holds it runs the release.
   * A read billed by the item's size (1 read unit up to 4 KB) rather than the refused writes of a release
   * on every stripe, which the partitions of a busy split lock would feel. A read that fails past its
   * retries runs the release, which is conditional: no iteration fails the Map, which would stop the
   * release on the stripe that holds the permit.
   */
  private releaseOnEachStripe(
    table: ISemaphoreTable,
    from: string,
    lockNameValue: string,
    stripes: number,
    release: (from: string, lockNameValue: string) => sfn.IChainable,
    notHeld: sfn.Succeed,
  ): sfn.IChainable {
    const list = new sfn.Pass(this, 'List Lock Stripes', {
      parameters: { stripes: sfn.JsonPath.arrayRange(0, stripes - 1, 1) },
      resultPath: '$.lockStripes',
    });
    const eachStripe = new sfn.Map(this, 'Release On Each Stripe', {
      itemsPath: '$.lockStripes.stripes',
      itemSelector: {
        executionArn: sfn.JsonPath.stringAt(`${from}.executionArn`),
        stateMachineArn: sfn.JsonPath.stringAt(`${from}.stateMachineArn`),
        redriveCount: sfn.JsonPath.numberAt(`${from}.redriveCount`),
        lockName: sfn.JsonPath.format(`{}${LOCK_STRIPE_SEPARATOR}{}`, lockNameValue, sfn.JsonPath.stringAt('$$.Map.Item.Value')),
      },
      resultPath: sfn.JsonPath.DISCARD,
    });
    const releaseHere = release('$', sfn.JsonPath.stringAt('$.lockName'));
    // The entry is a map attribute: `{"M":` in the projected item's text only if the stripe holds it
    // (no item: `{}`; an item without it: `{"Item":{}}`; execution names cannot hold a quote).
    const heldHere = new sfn.Choice(this, 'Held On This Stripe?')
      .when(sfn.Condition.stringMatches('$.stripe.item', '*{"M":*'), releaseHere)
      .otherwise(notHeld);
    const read = new tasks.DynamoGetItem(this, 'Read Stripe Of Stopped Execution', {
      table: table.table,
      key: { [LOCK_KEY]: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$.lockName')) },
      consistentRead: true,
      projectionExpression: [new tasks.DynamoProjectionExpression().withAttribute('#holder')],
      expressionAttributeNames: { '#holder': holderKeyAt('$.stateMachineArn', '$.executionArn') },
      resultSelector: { item: sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$')) },
      resultPath: '$.stripe',
    })
      .addRetry(transientRetry([...THROTTLING_ERRORS, ...SERVER_ERRORS]))
      .addCatch(releaseHere, { errors: [sfn.Errors.ALL], resultPath: sfn.JsonPath.DISCARD });
    eachStripe.itemProcessor(read.next(heldHere));
    return list.next(eachStripe);
  }

  /**
   * The first state: an event of another status (a rule edited by hand, an archive replayed, a status
   * Step Functions adds later) is ignored, and an event without a numeric `redriveCount` is of the
   * first run (events from before redrive existed carry none). The rules run in order, so that each
   * comparison sees a field that is present and of its type.
   */
  private checkEvent(next: sfn.IChainable): sfn.IChainable {
    const ignore = new sfn.Succeed(this, 'Not A Stopped Execution');
    const status = '$.detail.status';
    const redriveCount = '$.detail.redriveCount';
    const firstRun = new sfn.Pass(this, 'Redrive Count Missing: First Run', { result: sfn.Result.fromNumber(0), resultPath: redriveCount });
    firstRun.next(next);
    return new sfn.Choice(this, 'Stopped Execution?')
      .when(sfn.Condition.not(sfn.Condition.isPresent(status)), ignore)
      .when(sfn.Condition.not(sfn.Condition.isString(status)), ignore)
      .when(sfn.Condition.not(sfn.Condition.or(...CleanFromIncomplete.STOPPED_STATUSES.map((s) => sfn.Condition.stringEquals(status, s)))), ignore)
      .when(sfn.Condition.not(sfn.Condition.isPresent(redriveCount)), firstRun)
      .when(sfn.Condition.not(sfn.Condition.isNumeric(redriveCount)), firstRun)
      .otherwise(next);
  }
}
