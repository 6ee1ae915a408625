import * as ddb from '@aws-sdk/client-dynamodb';
import { Stack, Stage } from 'aws-cdk-lib';
import { CallbackTokens, executionStopped, WAIT_FOR_TASK_TOKEN, withToken, withTokenMarkers } from './callbacks';
import { ACCOUNT, CfnTemplate, PhysicalResource, physicalResources, REGION, resolve } from './cfn';
import { CapacityOptions, DynamoFaults, DynamoTaskRunner, CodeDynamoDbEndpoint, eventuallyConsistentRead, LocalDynamoDb, TaskError } from './dynamodb';
import { EventPattern, matchesPattern, TargetInput, targetInput } from './eventbridge';
import { LambdaContext, LambdaHandler, loadHandler } from './lambda';
import { loadLocalStepFunctions, LocalStepFunctions } from './local-sfn';
import { chance, Random, seededRandom } from './random';
import { ApiError, StepFunctionsApi } from './sfn-api';
import { HISTORY_EVENT_LIMIT } from '../src/private/history-budget';
import { executionHolderKey } from '../src/private/lock-schema';

/*
 * Runs the state machines of a synthesized stack on this machine: definitions resolved from the
 * template, executed by aws-local-stepfunctions, DynamoDB tasks on dynalite, Lambda functions from
 * their synthesized code, status-change events matched against the stack's EventBridge rules and
 * delivered to their targets, scheduled rules fired on the simulated clock. No AWS account.
 */

/** What a task handler receives besides its input. */
export interface TaskContext {
  readonly simulator: Simulator;
  readonly execution: Execution;
  readonly stateName: string;
  /** Aborted when the execution stops (succeeds, fails, is aborted or times out). */
  readonly signal: AbortSignal;
}

export type TaskHandler = (input: any, context: TaskContext) => Promise<unknown> | unknown;

/** Faults injected into the delivery of EventBridge events. */
export interface EventFaults {
  /** Probability that an event is never delivered. @default 0 */
  readonly lossRate?: number;
  /** Probability that an event is delivered twice. @default 0 */
  readonly duplicateRate?: number;
  /** Deliveries are delayed by up to this many simulated seconds. @default 0 */
  readonly maxDelaySeconds?: number;
  /**
   * Probability that a delivery to a state machine target fails (StartExecution throttled): EventBridge
   * retries it as the target's RetryPolicy says (by default 185 times within 24 hours), then sends it to
   * the target's dead-letter queue, or drops it; either is recorded in `undeliveredEvents`. @default 0
   */
  readonly targetFailureRate?: number;
}

export interface SimulatorOptions {
  /** Real time per simulated time: 0.01 runs one simulated second in 10 ms. @default 0.01 */
  readonly timeScale?: number;
  /** Seed of every random draw (jitter, faults). @default 1 */
  readonly seed?: number;
  readonly dynamoFaults?: DynamoFaults;
  /**
   * DynamoDB's capacity rules: units are always counted as DynamoDB bills them; with
   * `partitionLimits`, a partition key over 1,000 write or 3,000 read units a simulated second is
   * throttled. @default - counted, not throttled
   */
  readonly capacity?: CapacityOptions;
  /**
   * How long a DynamoDB transaction is under way, in simulated milliseconds. While it is, a write of
   * one of its items (`PutItem`, `UpdateItem`, `DeleteItem`) is refused with
   * `TransactionConflictException`, and a transaction with one of its items is cancelled with the
   * reason `TransactionConflict` (a `TransactGetItems` under way refuses transactions only), as
   * DynamoDB's "transaction conflict handling" lists them
   * (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html#transaction-conflict-handling);
   * refused calls are not billed. The transaction's changes are applied when it begins and its answer
   * comes when it ends. AWS does not document how long a transaction keeps its items: take something
   * near its latency (tens of milliseconds) and try a few. With 0, transactions take no time and
   * conflict only where `dynamoFaults.transactionConflictRate` injects it. @default 0
   */
  readonly transactionMillis?: number;
  /**
   * Length of the task tokens `.waitForTaskToken` tasks get. AWS's are opaque and up to 2,048
   * characters; those seen in practice are several hundred. @default 700
   */
  readonly taskTokenLength?: number;
  readonly eventFaults?: EventFaults;
  /**
   * Probability that a `SendTaskSuccess` made by a state machine task is lost: the call reports
   * success but the waiting task never hears of it, as when the caller stopped between the write that
   * handed over a permit and the wake-up. @default 0
   */
  readonly lostWakeUpRate?: number;
  /**
   * Probability that a Step Functions call made by a state machine task (`aws-sdk:sfn:*`) is
   * throttled: it does nothing and fails with `Sfn.SfnException`, "Rate exceeded", as an error the
   * Step Functions API model does not define reaches an AWS SDK integration. @default 0
   */
  readonly sfnThrottleRate?: number;
  /**
   * Probability that a task's Lambda invocation fails in the Lambda service before the function runs,
   * with one of the errors Step Functions advises to retry (`Lambda.ServiceException`,
   * `Lambda.AWSLambdaException`, `Lambda.SdkClientException`, `Lambda.TooManyRequestsException`;
   * https://docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html). @default 0
   */
  readonly lambdaServiceErrorRate?: number;
  /**
   * Eventually consistent reads of Step Functions: `DescribeExecution` and `ListExecutions` "are
   * eventually consistent", so with probability `rate` an answer (to a Lambda function, or to a task's
   * AWS SDK integration) is as of a moment up to `windowSeconds` ago: an execution started since is
   * not found, one that changed since shows its previous status. DynamoDB reads that are not strongly
   * consistent, which dynalite cannot answer stale, are refused instead: a state machine's when the
   * simulator starts, a Lambda function's (or an SDK client's) when it is made, with a ValidationException
   * (`codeDynamoDb.refused`). @default - always current
   */
  readonly staleReads?: StaleReads;
  /**
   * Lambda functions by logical ID, in place of their synthesized code, for `lambda:invoke` tasks,
   * direct function ARN tasks and rule targets. They run under the function's `Timeout` (default 3 s):
   * past it the task fails with `Lambda.Unknown`, as on AWS.
   */
  readonly lambdaHandlers?: Record<string, TaskHandler>;
  /** Overrides of any Task state, by state name. */
  readonly taskHandlers?: Record<string, TaskHandler>;
  /** Fire scheduled rules as simulated time passes. @default true */
  readonly schedules?: boolean;
}

export type ExecutionStatus = 'RUNNING' | 'SUCCEEDED' | 'FAILED' | 'TIMED_OUT' | 'ABORTED';

/** A simulated state machine. */
export interface SimStateMachine {
  readonly logicalId: string;
  readonly name: string;
  readonly arn: string;
  readonly definition: any;
  /** STANDARD or EXPRESS. */
  readonly type: 'STANDARD' | 'EXPRESS';
}

/**
 * An Express execution runs for at most five minutes ("Maximum duration: 5 minutes",
 * https://docs.aws.amazon.com/step-functions/latest/dg/choosing-workflow-type.html), emits no
 * status-change events (EventBridge carries those "from Step Functions standard workflows",
 * https://docs.aws.amazon.com/step-functions/latest/dg/eventbridge-integration.html), and can be
 * neither described nor redriven ("This API action is not supported by EXPRESS state machines",
 * https://docs.aws.amazon.com/step-functions/latest/apireference/API_DescribeExecution.html).
 */
const EXPRESS_MAX_SECONDS = 300;

/** How stale Step Functions' eventually consistent reads may be. */
export interface StaleReads {
  /** How far back a stale answer may be, simulated seconds. */
  readonly windowSeconds: number;
  /** Probability that an answer is stale. */
  readonly rate: number;
}

/** Options of one execution. */
export interface StartOptions {
  /** Execution name. @default - exec-<n> */
  readonly name?: string;
  /** Stop the execution after this many simulated seconds, wherever it is (a StopExecution call). */
  readonly abortAfterSeconds?: number;
}

/** One execution, running or finished. */
export class Execution {
  public status: ExecutionStatus = 'RUNNING';
  public output: unknown;
  public error?: string;
  public cause?: string;
  public stopDate?: number;
  /** Billed state transitions: states entered plus retries. */
  public transitions = 0;
  /** Transitions by state name. */
  public readonly stateTransitions = new Map<string, number>();
  /** DynamoDB calls made by this execution's tasks. */
  public dynamoCalls = 0;
  /** Capacity units its DynamoDB calls consumed, as DynamoDB bills them. */
  public writeUnits = 0;
  public readUnits = 0;
  /** Resolves when the execution has stopped and its events are counted (a redrive gives a new one). */
  public done: Promise<Execution>;
  /** Aborted when the execution stops, whatever the reason (a redrive gives a new one). */
  public stopped = new AbortController();
  /** How many times it was redriven. */
  public redriveCount = 0;
  /** When it was last redriven (simulated epoch ms; `$$.Execution.RedriveTime`). */
  public redriveDate?: number;
  /**
   * Its history, event by event as Step Functions logs it (see `historyEventsOf`), all its runs
   * together: `name` and `input` on the events of states entered, `state` on the others of a state.
   */
  public readonly history: Array<{
    type: string;
    name?: string;
    state?: string;
    input?: unknown;
    output?: unknown;
    error?: string;
    cause?: string;
    /** A task's own events: which of its state's calls (`taskCalls`) they are about. */
    call?: number;
    timestamp: number;
  }> = [];
  /**
   * @internal The calls of each Task state, in order (a retry is a call of its own): the parameters it
   * was called with, and its result; for the details of the task's history events.
   */
  public readonly taskCalls = new Map<string, Array<{ parameters: unknown; output?: unknown }>>();
  /** @internal How many times each Task state (outside a Map) was scheduled: the index of its current call. */
  public readonly taskScheduled = new Map<string, number>();
  /** @internal Outputs of the Parallel branches the last redrive did not run again, by `parallel#branch`. */
  public redriveSkippedBranches = new Map<string, unknown>();
  /** @internal */
  public abortRun?: () => void;
  /** @internal A state whose output passed the payload quota: the execution fails with States.DataLimitExceeded. */
  public dataLimitExceeded?: string;
  /** Events in its history: at HISTORY_EVENT_LIMIT it fails with States.Runtime. */
  public get historyEvents(): number {
    return this.history.length;
  }
  /** @internal The history reached HISTORY_EVENT_LIMIT: the execution fails with States.Runtime. */
  public historyLimitExceeded?: string;
  /** @internal Each change of its status and run, for eventually consistent reads. */
  public readonly statusLog: Array<{ readonly at: number; readonly status: ExecutionStatus; readonly redriveCount: number }> = [];
  private resolveDone!: (e: Execution) => void;

  constructor(
    public readonly arn: string,
    public readonly name: string,
    public readonly stateMachine: SimStateMachine,
    public readonly input: unknown,
    public readonly startDate: number,
  ) {
    this.done = new Promise((done) => (this.resolveDone = done));
    this.history.push({ type: 'ExecutionStarted', timestamp: startDate });
    this.statusLog.push({ at: startDate, status: 'RUNNING', redriveCount: 0 });
  }

  /** Its holder id in a lock item (the hash of its state machine's ARN, `:`, its name). */
  public get holderId(): string {
    return executionHolderKey(this.stateMachine.arn, this.name);
  }

  /** Stop the execution, like `StopExecution`. */
  public abort(error?: string, cause?: string): void {
    if (this.status === 'RUNNING' && this.abortRun) {
      this.error = error;
      this.cause = cause;
      this.abortRun();
    }
  }

  /** @internal */
  public finish(): void {
    this.resolveDone(this);
  }

  /** @internal */
  public restart(now: number): void {
    this.status = 'RUNNING';
    this.output = this.error = this.cause = this.stopDate = undefined;
    this.redriveCount++;
    this.redriveDate = now;
    this.stopped = new AbortController();
    this.done = new Promise((done) => (this.resolveDone = done));
    this.history.push({ type: 'ExecutionRedriven', timestamp: now });
    this.statusLog.push({ at: now, status: 'RUNNING', redriveCount: this.redriveCount });
  }
}

/**
 * At Step Functions' quota of history events per execution (HISTORY_EVENT_LIMIT): "When an execution
 * reaches 24,999 events, it waits for the next event to happen. If the event number 25,000 is
 * ExecutionSucceeded, the execution finishes successfully. If the event number 25,000 isn't
 * ExecutionSucceeded, the ExecutionFailed event is logged and the state machine execution fails because
 * of reaching the history limit." https://docs.aws.amazon.com/step-functions/latest/dg/bp-history-limit.html
 * The error is not documented; executions that reached the limit report `States.Runtime` with this
 * cause (github.com/loads/ardere/issues/86), and cannot be redriven ("Execution history event limit
 * exceeded", a RedriveStatusReason of DescribeExecution).
 */
const HISTORY_LIMIT_CAUSE = `The execution reached the maximum number of history events (${HISTORY_EVENT_LIMIT}).`;

/**
 * The history events an event of the interpreter stands for, as Step Functions logs a Standard
 * execution (HistoryEvent types, https://docs.aws.amazon.com/step-functions/latest/apireference/API_HistoryEvent.html):
 * a Pass, Choice, Wait or Succeed state is entered and exited (2); a Task is entered, scheduled,
 * started, (submitted, with a callback,) ends (succeeded, failed or timed out) and is exited (5, 6),
 * and each retry schedules and starts it again after the failure (3, 4); a Parallel or Map is
 * entered, started, ends and is exited (4), each Map iteration starting and ending (2); a Fail state
 * is entered, and the execution's end follows. A failure caught still exits the state. A Task whose
 * resource is a function's ARN logs `LambdaFunction…` in place of `Task…`, as many.
 */
function historyEventsOf(event: InterpreterEvent, state: any, caught: boolean): string[] {
  const types = stateHistoryEventsOf(event, state, caught);
  // A Task whose resource is a function's ARN (the legacy Lambda integration) logs its own events as
  // LambdaFunction… (LambdaFunctionScheduledEventDetails: "The Amazon Resource Name (ARN) of the
  // scheduled Lambda function").
  return isLegacyLambda(state) ? types.map((t) => LEGACY_LAMBDA_EVENTS[t] ?? t) : types;
}

const LEGACY_LAMBDA_EVENTS: Record<string, string> = {
  TaskScheduled: 'LambdaFunctionScheduled',
  TaskStarted: 'LambdaFunctionStarted',
  TaskSucceeded: 'LambdaFunctionSucceeded',
  TaskFailed: 'LambdaFunctionFailed',
  TaskTimedOut: 'LambdaFunctionTimedOut',
};

function isLegacyLambda(state: any): boolean {
  return state?.Type === 'Task' && typeof state.Resource === 'string' && /^arn:aws[a-z-]*:lambda:/.test(state.Resource);
}

/** A value as a history event's details give it: JSON text. */
function historyJson(value: unknown): string {
  return JSON.stringify(value ?? null);
}

/** A history event's `input` or `output` with its details (never truncated here). */
function historyData(field: 'input' | 'output', value: unknown): Record<string, unknown> {
  return { [field]: historyJson(value), [`${field}Details`]: { truncated: false } };
}

/** An error's cause as the history gives it: text. */
function causeText(cause: unknown): string | undefined {
  if (cause === undefined || cause === null) return undefined;
  return typeof cause === 'string' ? cause : cause instanceof Error ? cause.message : JSON.stringify(cause);
}

/** A task's own history events (not its state's entry and exit). */
function isTaskEvent(type: string): boolean {
  return (type.startsWith('Task') && !type.startsWith('TaskState')) || type.startsWith('LambdaFunction');
}

/**
 * The details of a task's own history event (HistoryEvent's task… and lambdaFunction… details): the
 * resource as `resourceType` (the service, or `aws-sdk:<service>`) and `resource` (the action, with its
 * pattern), the parameters it was called with, its result, or its error.
 * https://docs.aws.amazon.com/step-functions/latest/apireference/API_HistoryEvent.html
 */
function taskEventDetails(
  h: { type: string; error?: string; cause?: string },
  state: any,
  call: { parameters: unknown; output?: unknown } | undefined,
): Record<string, unknown> {
  const resourceArn = String(state?.Resource ?? '');
  if (isLegacyLambda(state)) {
    switch (h.type) {
      case 'LambdaFunctionScheduled':
        return {
          lambdaFunctionScheduledEventDetails: {
            resource: resourceArn,
            ...(call ? historyData('input', call.parameters) : {}),
            ...(state.TimeoutSeconds !== undefined ? { timeoutInSeconds: state.TimeoutSeconds } : {}),
          },
        };
      case 'LambdaFunctionSucceeded':
        return { lambdaFunctionSucceededEventDetails: call ? historyData('output', call.output) : {} };
      case 'LambdaFunctionFailed':
        return { lambdaFunctionFailedEventDetails: { error: h.error, cause: h.cause } };
      case 'LambdaFunctionTimedOut':
        return { lambdaFunctionTimedOutEventDetails: { error: h.error, cause: h.cause } };
      default:
        return {};
    }
  }
  const m = /^arn:aws[a-z-]*:states:::(aws-sdk:)?([a-z0-9-]+):(.+)$/.exec(resourceArn);
  const resource = m ? { resourceType: `${m[1] ?? ''}${m[2]}`, resource: m[3] } : { resourceType: resourceArn, resource: resourceArn };
  switch (h.type) {
    case 'TaskScheduled':
      return {
        taskScheduledEventDetails: {
          ...resource,
          region: REGION,
          ...(call ? { parameters: historyJson(call.parameters) } : {}),
          ...(state?.TimeoutSeconds !== undefined ? { timeoutInSeconds: state.TimeoutSeconds } : {}),
          ...(state?.HeartbeatSeconds !== undefined ? { heartbeatInSeconds: state.HeartbeatSeconds } : {}),
        },
      };
    case 'TaskStarted':
      return { taskStartedEventDetails: resource };
    case 'TaskSubmitted':
      return { taskSubmittedEventDetails: resource };
    case 'TaskSucceeded':
      return { taskSucceededEventDetails: { ...resource, ...(call ? historyData('output', call.output) : {}) } };
    case 'TaskFailed':
      return { taskFailedEventDetails: { ...resource, error: h.error, cause: h.cause } };
    case 'TaskTimedOut':
      return { taskTimedOutEventDetails: { ...resource, error: h.error, cause: h.cause } };
    default:
      return {};
  }
}

type InterpreterEvent = { type: string; state?: { name: string; type: string }; Error?: string };

function stateHistoryEventsOf(event: InterpreterEvent, state: any, caught: boolean): string[] {
  const type = event.state?.type ?? '';
  const task = type === 'Task';
  const scheduled = task ? ['TaskScheduled', 'TaskStarted', ...(typeof state?.Resource === 'string' && state.Resource.endsWith(WAIT_FOR_TASK_TOKEN) ? ['TaskSubmitted'] : [])] : [];
  switch (event.type) {
    case 'StateEntered':
      return [`${type}StateEntered`, ...scheduled, ...(type === 'Parallel' || type === 'Map' ? [`${type}StateStarted`] : [])];
    case 'StateFailed':
      if (task) return [event.Error === 'States.Timeout' ? 'TaskTimedOut' : 'TaskFailed'];
      return type === 'Parallel' || type === 'Map' ? [`${type}StateFailed`] : [];
    case 'StateRetried':
      return task ? scheduled : type === 'Parallel' ? ['ParallelStateStarted'] : [];
    case 'StateExited':
      return [...(task && !caught ? ['TaskSucceeded'] : (type === 'Parallel' || type === 'Map') && !caught ? [`${type}StateSucceeded`] : []), `${type}StateExited`];
    case 'MapIterationStarted':
    case 'MapIterationSucceeded':
    case 'MapIterationFailed':
      return [event.type];
    default:
      return [];
  }
}

/** A rule's target, as the template gives it. */
type SimTarget = TargetInput & {
  readonly Arn: string;
  readonly RetryPolicy?: { readonly MaximumRetryAttempts?: number; readonly MaximumEventAgeInSeconds?: number };
  readonly DeadLetterConfig?: { readonly Arn?: string };
};

interface SimRule {
  readonly logicalId: string;
  readonly arn: string;
  readonly pattern?: EventPattern;
  readonly scheduleSeconds?: number;
  readonly targets: SimTarget[];
}

/** The state a redrive inside a Parallel branch starts with: it restores the unsuccessful state's input. */
export const REDRIVE_RESUME = 'Redrive: Resume';

/** A setTimeout kept in `timers` until it fires or is cleared, so that stop() can clear what is left. */
function trackedTimeout(timers: Set<NodeJS.Timeout>, callback: () => void, ms: number): NodeJS.Timeout {
  const timer = setTimeout(() => {
    timers.delete(timer);
    callback();
  }, ms);
  timers.add(timer);
  return timer;
}

export class Simulator {
  /**
   * Start a simulator for every state machine, table, function and rule of `stack`. One runs at a
   * time in a process (functions' environments are the process's): stop it before starting another.
   */
  public static async start(stack: Stack, options: SimulatorOptions = {}): Promise<Simulator> {
    if (Simulator.running) throw new Error('a simulator is already running in this process: stop it first (Lambda code shares process.env)');
    Simulator.running = true;
    try {
      const assembly = Stage.of(stack)!.synth();
      const template = assembly.getStackArtifact(stack.artifactId).template as CfnTemplate;
      const db = await LocalDynamoDb.start();
      const sim = new Simulator(template, stack.stackName, assembly.directory, db, options);
      await db.createTables(
        template,
        new Map([...sim.resources].filter(([, r]) => r.type === 'AWS::DynamoDB::Table').map(([id, r]) => [id, r.ref])),
      );
      await sim.startServices();
      return sim;
    } catch (e) {
      Simulator.running = false;
      throw e;
    }
  }

  /** Whether a simulator runs in this process: Lambda code reads `process.env`, so one at a time. */
  private static running = false;

  public readonly random: Random;
  public readonly dynamo: DynamoTaskRunner;
  public readonly stateMachines = new Map<string, SimStateMachine>();
  public readonly executions = new Map<string, Execution>();
  private readonly executionsByHolderId = new Map<string, Execution>();
  /** Status-change events emitted, in order. */
  public readonly events: Array<Record<string, any>> = [];
  /** Wake-ups (SendTaskSuccess from tasks) lost by injected faults. */
  public lostWakeUps = 0;
  /** Answers of DescribeExecution and ListExecutions given stale (`staleReads`). */
  public staleAnswers = 0;
  /**
   * Events a rule could not deliver to a state machine target after its retries: sent to the target's
   * dead-letter queue (`deadLetterQueue` its ARN), or dropped (none).
   */
  public readonly undeliveredEvents: Array<{ rule: string; target: string; deadLetterQueue?: string; event: Record<string, unknown> }> = [];
  /** Attempts to start a rule's state machine target that failed (`targetFailureRate`). */
  public failedTargetDeliveries = 0;
  /** Step Functions calls of tasks that were throttled (`sfnThrottleRate`). */
  public throttledSfnCalls = 0;
  /** Events lost by injected faults. */
  public lostEvents = 0;
  /** Lambda invocations, by logical ID. */
  public readonly lambdaInvocations = new Map<string, number>();
  /** Asynchronous invocations (from rules) that failed every attempt: what a dead-letter queue would receive. */
  public readonly asyncFailures: Array<{ functionLogicalId: string; event: unknown; error: string }> = [];
  /** What each function's code logged, by logical ID (its log group). */
  public readonly lambdaLogs = new Map<string, string[]>();
  public eventFaults: EventFaults;
  public readonly resources: Map<string, PhysicalResource>;
  public sfnApi?: StepFunctionsApi;
  /**
   * The DynamoDB of the code under test (Lambda functions, SDK clients of the process): dynalite behind
   * the capacity model, and with `staleReads`, refusing eventually consistent reads (`refused` lists them).
   */
  public codeDynamoDb!: CodeDynamoDbEndpoint;
  public readonly timeScale: number;

  private readonly sfn: LocalStepFunctions;
  private readonly realStart = Date.now();
  private readonly rules: SimRule[] = [];
  private readonly pending = new Set<Promise<unknown>>();
  private readonly timers = new Set<NodeJS.Timeout>();
  /** The timers of pending sleeps, each with what forgets its signal (see sleep). */
  private readonly sleeps = new Map<NodeJS.Timeout, () => void>();
  /** The interpreter's pending timers (its Wait states, retry intervals, task and execution timeouts): stop() clears them. */
  private readonly moduleTimers = new Set<NodeJS.Timeout>();
  /** Whether stop() has run: sleeps no longer end. */
  private ended = false;
  private executionCounter = 0;
  private readonly interpreters = new Map<string, InstanceType<LocalStepFunctions['StateMachine']>>();
  private readonly lambdas = new Map<string, LambdaHandler>();
  private readonly savedEnv: Record<string, string | undefined> = {};
  private readonly stateListeners: Array<(execution: Execution, stateName: string, enteredAt: number) => void> = [];
  private readonly taskListeners: Array<(execution: Execution, stateName: string) => void> = [];
  private readonly taskEndListeners: Array<(execution: Execution, stateName: string) => void> = [];
  private readonly stopListeners: Array<(execution: Execution) => void> = [];
  /** Task tokens of `.waitForTaskToken` tasks. */
  public readonly callbacks = new CallbackTokens((seconds, signal) => this.sleep(seconds, signal));

  private constructor(
    private readonly template: CfnTemplate,
    private readonly stackName: string,
    private readonly assemblyDir: string,
    public readonly db: LocalDynamoDb,
    private readonly options: SimulatorOptions,
  ) {
    this.timeScale = options.timeScale ?? 0.01;
    this.random = seededRandom(options.seed ?? 1);
    this.sfn = loadLocalStepFunctions(this.timeScale, this.random, () => this.now(), {
      setTimeout: (callback, ms) => trackedTimeout(this.moduleTimers, callback, ms),
      clearTimeout: (timer) => {
        if (timer === undefined) return;
        this.moduleTimers.delete(timer);
        clearTimeout(timer);
      },
    });
    const { dynamoFaults, capacity, transactionMillis } = options;
    this.dynamo = new DynamoTaskRunner(db, this.random, (s) => this.sleep(s), dynamoFaults, capacity, () => this.now(), transactionMillis ?? 0);
    this.callbacks.tokenLength = options.taskTokenLength ?? 700;
    this.eventFaults = options.eventFaults ?? {};
    this.resources = physicalResources(template, stackName);

    for (const [logicalId, resource] of Object.entries(template.Resources)) {
      const props = resource.Properties ?? {};
      if (resource.Type === 'AWS::StepFunctions::StateMachine') {
        const physical = this.resources.get(logicalId)!;
        const body = resolve(props.DefinitionString ?? props.Definition, this.resources, stackName);
        let definition = typeof body === 'string' ? JSON.parse(body) : body;
        if (props.DefinitionSubstitutions) {
          const subs = resolve(props.DefinitionSubstitutions, this.resources, stackName) as Record<string, string>;
          let text = JSON.stringify(definition);
          for (const [k, v] of Object.entries(subs)) text = text.split('${' + k + '}').join(v);
          definition = JSON.parse(text);
        }
        refuseWhatItCannotRun(logicalId, definition, props.StateMachineType, options.staleReads !== undefined);
        const type = props.StateMachineType === 'EXPRESS' ? 'EXPRESS' : 'STANDARD';
        if (type === 'EXPRESS') definition = { ...definition, TimeoutSeconds: Math.min(definition.TimeoutSeconds ?? EXPRESS_MAX_SECONDS, EXPRESS_MAX_SECONDS) };
        this.stateMachines.set(logicalId, { logicalId, name: physical.attributes.Name, arn: physical.ref, definition, type });
      } else if (resource.Type === 'AWS::Events::Rule' && props.State !== 'DISABLED') {
        this.rules.push({
          logicalId,
          arn: this.resources.get(logicalId)!.attributes.Arn,
          pattern: props.EventPattern && resolve(props.EventPattern, this.resources, stackName),
          scheduleSeconds: props.ScheduleExpression ? scheduleSeconds(props.ScheduleExpression) : undefined,
          targets: resolve(props.Targets ?? [], this.resources, stackName),
        });
      }
    }
  }

  /** Simulated time, epoch milliseconds. */
  public now(): number {
    return this.simulatedTimeOf(Date.now());
  }

  /** The simulated time of a moment of real time (`Date.now()`'s epoch ms); now for none. */
  private simulatedTimeOf(realMillis: number | undefined): number {
    return realMillis === undefined ? this.now() : this.realStart + (realMillis - this.realStart) / this.timeScale;
  }

  /**
   * Sleep for simulated seconds; a signal that aborts (or had aborted already: a stopped execution's) ends the sleep at once.
   * A sleep still pending when the simulator stops never ends: what waited on it (a Lambda function's next
   * attempt, a late event) would otherwise run after the simulation, against a stopped DynamoDB, and its timer
   * would keep the process (a Jest worker) alive.
   */
  public sleep(seconds: number, signal?: AbortSignal): Promise<void> {
    return new Promise((done) => {
      if (signal?.aborted) return done();
      if (this.ended) return;
      const onAbort = () => {
        clearTimeout(timer);
        this.sleeps.delete(timer);
        done();
      };
      const timer = setTimeout(() => {
        this.sleeps.delete(timer);
        signal?.removeEventListener('abort', onAbort);
        done();
      }, Math.min(seconds * 1000 * this.timeScale, 2147483647));
      this.sleeps.set(timer, () => signal?.removeEventListener('abort', onAbort));
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** The state machine with this logical ID, or whose logical ID starts with it. */
  public stateMachine(logicalIdPrefix: string): SimStateMachine {
    const exact = this.stateMachines.get(logicalIdPrefix);
    const matches = exact ? [exact] : [...this.stateMachines.values()].filter((sm) => sm.logicalId.startsWith(logicalIdPrefix));
    if (matches.length !== 1) {
      throw new Error(`expected one state machine ${logicalIdPrefix}, found ${matches.map((m) => m.logicalId).join(', ') || 'none'}`);
    }
    return matches[0];
  }

  /** Call `listener` each time an execution's task starts its call, before the call is on its way. */
  public onTaskStarted(listener: (execution: Execution, stateName: string) => void): void {
    this.taskListeners.push(listener);
  }

  /** Call `listener` each time an execution's task has its answer (a result or an error; a callback task's callback). */
  public onTaskEnded(listener: (execution: Execution, stateName: string) => void): void {
    this.taskEndListeners.push(listener);
  }

  /**
   * Call `listener` each time an execution enters a state (nested branches included), with the time it
   * entered it (simulated epoch ms, as `$$.State.EnteredTime`). The listener runs a moment later: the
   * interpreter hands its events over late, by seconds of simulated time on a loaded machine (measured:
   * up to 12 s at timeScale 0.02), so `now()` inside it is not when the state was entered.
   */
  public onStateEntered(listener: (execution: Execution, stateName: string, enteredAt: number) => void): void {
    this.stateListeners.push(listener);
  }

  /** Call `listener` each time an execution stops. */
  public onExecutionStopped(listener: (execution: Execution) => void): void {
    this.stopListeners.push(listener);
  }

  /**
   * Start an execution, like `StartExecution`: "If StartExecution is called with the same name and
   * input as a running execution, the call succeeds and returns the same response as the original
   * request. If the execution is closed or if the input is different, it returns a 400
   * ExecutionAlreadyExists error." (https://docs.aws.amazon.com/step-functions/latest/apireference/API_StartExecution.html)
   */
  public startExecution(stateMachine: SimStateMachine, input: unknown = {}, options: StartOptions = {}): Execution {
    const execName = options.name ?? `exec-${++this.executionCounter}`;
    const arn = `arn:aws:states:${REGION}:${ACCOUNT}:execution:${stateMachine.name}:${execName}`;
    const existing = this.executions.get(arn);
    if (existing) {
      if (existing.status === 'RUNNING' && JSON.stringify(existing.input) === JSON.stringify(input)) return existing;
      throw new ApiError('ExecutionAlreadyExists', `Execution Already Exists: '${arn}'`);
    }
    // The first execution of a state machine validates its definition, which takes a moment of real
    // time (many simulated seconds): before the start time is read, as Step Functions validates at
    // deploy time.
    this.interpreter(stateMachine);
    const execution = new Execution(arn, execName, stateMachine, input, this.now());
    this.executions.set(arn, execution);
    this.executionsByHolderId.set(execution.holderId, execution);
    this.track(this.run(execution));
    if (options.abortAfterSeconds !== undefined) {
      this.track(
        this.sleep(options.abortAfterSeconds, execution.stopped.signal).then(() =>
          execution.abort('Simulation.Abort', 'stopped by the simulation'),
        ),
      );
    }
    return execution;
  }

  /** The execution a holder id of a lock item names (see `Execution.holderId`), if this simulator started it. */
  public executionOfHolder(holderId: string): Execution | undefined {
    return this.executionsByHolderId.get(holderId);
  }

  /** Executions of one state machine, in start order. */
  public executionsOf(stateMachine: SimStateMachine): Execution[] {
    return [...this.executions.values()].filter((e) => e.stateMachine === stateMachine);
  }

  /** Wait until no execution runs and no event is on its way (scheduled rules excepted). */
  public async idle(): Promise<void> {
    while (this.pending.size > 0) {
      await Promise.allSettled([...this.pending]);
    }
  }

  /** Every item of a table (by logical ID prefix or physical name). */
  /** The physical name of a table, by logical ID (or prefix). */
  public tableName(table: string): string {
    const resource = [...this.resources.values()].find((r) => r.type === 'AWS::DynamoDB::Table' && (r.logicalId.startsWith(table) || r.ref === table));
    if (!resource) throw new Error(`no table ${table} in the stack`);
    return resource.ref;
  }

  public async scan(table: string): Promise<Array<Record<string, ddb.AttributeValue>>> {
    const resource = [...this.resources.values()].find(
      (r) => r.type === 'AWS::DynamoDB::Table' && (r.logicalId.startsWith(table) || r.ref === table),
    );
    const items: Array<Record<string, ddb.AttributeValue>> = [];
    let ExclusiveStartKey: Record<string, ddb.AttributeValue> | undefined;
    do {
      const page = await this.db.call('Scan', { TableName: resource?.ref ?? table, ExclusiveStartKey, ConsistentRead: true });
      items.push(...((page.Items as Array<Record<string, ddb.AttributeValue>>) ?? []));
      ExclusiveStartKey = page.LastEvaluatedKey as Record<string, ddb.AttributeValue> | undefined;
    } while (ExclusiveStartKey);
    return items;
  }

  /** The items of a table (by physical name) that exist among `keys`, read consistently, in any order. */
  public async getItems(tableName: string, keys: Array<Record<string, unknown>>): Promise<Array<Record<string, ddb.AttributeValue>>> {
    const items: Array<Record<string, ddb.AttributeValue>> = [];
    // BatchGetItem takes at most 100 keys.
    for (let at = 0; at < keys.length; at += 100) {
      let request: Record<string, unknown> | undefined = { [tableName]: { Keys: keys.slice(at, at + 100), ConsistentRead: true } };
      while (request !== undefined && Object.keys(request).length > 0) {
        const page = await this.db.call('BatchGetItem', { RequestItems: request });
        items.push(...(((page.Responses as Record<string, unknown[]> | undefined)?.[tableName] ?? []) as Array<Record<string, ddb.AttributeValue>>));
        request = page.UnprocessedKeys as Record<string, unknown> | undefined;
      }
    }
    return items;
  }

  /** Deliver an event to every rule it matches, as EventBridge would (subject to `eventFaults`). */
  public putEvent(event: Record<string, any>): void {
    for (const rule of this.rules) {
      if (!rule.pattern || !matchesPattern(rule.pattern, event)) continue;
      void this.deliverToTargets(rule, event, true);
    }
  }

  /**
   * The longest period of the scheduled rules that fire on the simulated clock, in simulated seconds:
   * the longest anything waits for a schedule (a reconciler's next sweep). 0 when none fires (no
   * scheduled rule, or `schedules: false`).
   */
  public get longestSchedulePeriodSeconds(): number {
    if (!(this.options.schedules ?? true)) return 0;
    return Math.max(0, ...this.rules.map((r) => r.scheduleSeconds ?? 0));
  }

  /** Fire a scheduled rule now (its logical ID or a prefix of it), and wait for its targets. */
  public async fireScheduledRule(logicalIdPrefix: string): Promise<void> {
    const rule = this.rules.find((r) => r.scheduleSeconds !== undefined && r.logicalId.startsWith(logicalIdPrefix));
    if (!rule) throw new Error(`no scheduled rule ${logicalIdPrefix}`);
    await Promise.all(this.deliverToTargets(rule, this.scheduledEvent(rule), false));
  }

  /** Fire every scheduled rule now, and wait for their targets. */
  public async fireScheduledRules(): Promise<void> {
    await Promise.all(
      this.rules.filter((r) => r.scheduleSeconds !== undefined).flatMap((rule) => this.deliverToTargets(rule, this.scheduledEvent(rule), false)),
    );
  }

  /** Invoke a Lambda function of the stack (its logical ID or a prefix of it) and return its result. */
  public async invokeFunction(logicalIdPrefix: string, event: unknown): Promise<unknown> {
    const fn = [...this.resources.values()].find((r) => r.type === 'AWS::Lambda::Function' && r.logicalId.startsWith(logicalIdPrefix));
    if (!fn) throw new Error(`no Lambda function ${logicalIdPrefix}`);
    return this.invokeLambda(fn, event);
  }

  public async stop(): Promise<void> {
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
    for (const execution of this.executions.values()) execution.abort();
    await this.idle();
    await this.sfnApi?.stop();
    await this.codeDynamoDb?.stop();
    await this.db.stop();
    // What is still asleep now waited beside the executions (a Lambda function's next attempt, a late event):
    // it never wakes (see sleep).
    this.ended = true;
    for (const [timer, forgetSignal] of this.sleeps) {
      clearTimeout(timer);
      forgetSignal();
    }
    this.sleeps.clear();
    // The interpreter's timers go too: a task's timeout is cleared only when the task settles, and a task
    // pending at the stop never does (local-sfn.ts, note 15).
    for (const timer of this.moduleTimers) clearTimeout(timer);
    this.moduleTimers.clear();
    for (const [k, v] of Object.entries(this.savedEnv)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    Simulator.running = false;
  }

  // ---- StepFunctionsBackend: what the local Step Functions API serves ----

  public describeExecution(executionArn: string): Record<string, unknown> {
    const e = this.executions.get(executionArn);
    if (!e) {
      throw new ApiError('ExecutionDoesNotExist', `Execution Does Not Exist: '${executionArn}'`);
    }
    if (e.stateMachine.type === 'EXPRESS') {
      throw new ApiError('InvalidArn', `DescribeExecution is not supported by EXPRESS state machines: '${executionArn}'`);
    }
    return {
      executionArn: e.arn,
      stateMachineArn: e.stateMachine.arn,
      name: e.name,
      status: e.status,
      startDate: e.startDate / 1000,
      ...(e.stopDate !== undefined ? { stopDate: e.stopDate / 1000 } : {}),
      input: JSON.stringify(e.input),
      inputDetails: { included: true },
      redriveCount: e.redriveCount,
      ...(e.redriveDate !== undefined ? { redriveDate: e.redriveDate / 1000 } : {}),
      ...(e.status === 'SUCCEEDED' ? { output: JSON.stringify(e.output), outputDetails: { included: true } } : {}),
      ...(e.error !== undefined ? { error: e.error } : {}),
      ...(e.cause !== undefined ? { cause: e.cause } : {}),
    };
  }

  /**
   * `DescribeExecution` as a caller sees it: with `staleReads`, sometimes as of a moment ago ("not
   * found" for an execution started since, the previous status of one that changed since).
   * https://docs.aws.amazon.com/step-functions/latest/apireference/API_DescribeExecution.html
   */
  public describeExecutionAsSeen(executionArn: string): Record<string, unknown> {
    const current = this.describeExecution(executionArn);
    const view = this.staleView(this.executions.get(executionArn)!);
    if (view === undefined) return current;
    if (view === 'unknown') throw new ApiError('ExecutionDoesNotExist', `Execution Does Not Exist: '${executionArn}'`);
    return staleDescription(current, view);
  }

  /** `ListExecutions` as a caller sees it: with `staleReads`, each execution sometimes as of a moment ago. */
  public listExecutionsAsSeen(stateMachineArn: string, statusFilter?: string, redriveFilter?: string): Array<Record<string, unknown>> {
    refusePendingRedrive(statusFilter);
    return this.listExecutions(stateMachineArn)
      .flatMap((listed) => {
        const view = this.staleView(this.executions.get(String(listed.executionArn))!);
        if (view === 'unknown') return [];
        return [view === undefined ? listed : staleDescription(listed, view)];
      })
      .filter((x) => !statusFilter || x.status === statusFilter)
      .filter((x) => !redriveFilter || (redriveFilter === 'REDRIVEN') === Number(x.redriveCount) > 0);
  }

  /** A stale view of an execution (its status and run a moment ago), 'unknown' (not started then), or undefined: current. */
  private staleView(e: Execution): { status: ExecutionStatus; redriveCount: number } | 'unknown' | undefined {
    const stale = this.options.staleReads;
    if (!stale || !chance(this.random, stale.rate)) return undefined;
    const asOf = this.now() - this.random() * stale.windowSeconds * 1000;
    const seen = [...e.statusLog].reverse().find((entry) => entry.at <= asOf);
    const last = e.statusLog[e.statusLog.length - 1];
    if (seen !== last) this.staleAnswers++;
    return seen ?? 'unknown';
  }

  public stopExecution(executionArn: string, error?: string, cause?: string): Record<string, unknown> {
    const e = this.executions.get(executionArn);
    if (!e) {
      throw new ApiError('ExecutionDoesNotExist', `Execution Does Not Exist: '${executionArn}'`);
    }
    e.abort(error, cause);
    return { stopDate: this.now() / 1000 };
  }

  /**
   * `RedriveExecution`: resume a failed, aborted or timed-out execution at the state it last entered,
   * with that state's input, inside the Parallel branches that enclose it (a Pass state named
   * REDRIVE_RESUME gives it that input there). Resolves when the redriven execution stops.
   */
  public redriveExecution(executionArn: string): Promise<Execution> {
    const e = this.executions.get(executionArn);
    if (!e) throw new ApiError('ExecutionDoesNotExist', `Execution Does Not Exist: '${executionArn}'`);
    if (!['FAILED', 'ABORTED', 'TIMED_OUT'].includes(e.status)) {
      throw new ApiError('ExecutionNotRedrivable', `Execution is ${e.status}: '${executionArn}'`);
    }
    if (e.stateMachine.type === 'EXPRESS') {
      throw new ApiError('ExecutionNotRedrivable', `Redrive is not supported by EXPRESS state machines: '${executionArn}'`);
    }
    if (e.historyLimitExceeded !== undefined) {
      throw new ApiError('ExecutionNotRedrivable', `Execution history event limit exceeded: '${executionArn}'`);
    }
    const definition = JSON.parse(JSON.stringify(e.stateMachine.definition));
    const runStart = e.history.map((h) => h.type).lastIndexOf(e.redriveCount === 0 ? 'ExecutionStarted' : 'ExecutionRedriven');
    const plan = new RedrivePlan(e.history, e.redriveSkippedBranches);
    const input = plan.resumeExecution(definition, runStart);
    e.redriveSkippedBranches = plan.skipped;
    e.restart(this.now());
    this.track(this.run(e, { definition, input }));
    return e.done;
  }

  /** `GetExecutionHistory`, with the fields the reconciler reads. */
  public getExecutionHistory(executionArn: string, reverseOrder: boolean): Array<Record<string, unknown>> {
    const e = this.executions.get(executionArn);
    if (!e) throw new ApiError('ExecutionDoesNotExist', `Execution Does Not Exist: '${executionArn}'`);
    let redrives = 0;
    // The details of HistoryEvent (https://docs.aws.amazon.com/step-functions/latest/apireference/API_HistoryEvent.html)
    // for the execution's start and end, each state entered and exited, and a task's own events.
    const states = new Map(allStates(e.stateMachine.definition));
    const events = e.history.map((h, i) => ({
      id: i + 1,
      timestamp: h.timestamp / 1000,
      type: h.type,
      ...(h.type === 'ExecutionStarted' ? { executionStartedEventDetails: historyData('input', e.input) } : {}),
      ...(h.name !== undefined ? { stateEnteredEventDetails: { name: h.name, ...historyData('input', h.input) } } : {}),
      ...(h.state !== undefined && h.type.endsWith('StateExited')
        ? { stateExitedEventDetails: { name: h.state, ...historyData('output', h.output) } }
        : {}),
      ...(isTaskEvent(h.type) && h.state !== undefined
        ? taskEventDetails(h, states.get(h.state), h.call === undefined ? undefined : e.taskCalls.get(h.state)?.[h.call])
        : {}),
      ...(h.type === 'ExecutionRedriven' ? { executionRedrivenEventDetails: { redriveCount: ++redrives } } : {}),
      ...(h.type === 'ExecutionSucceeded' ? { executionSucceededEventDetails: historyData('output', h.output) } : {}),
      ...(h.type === 'ExecutionFailed' ? { executionFailedEventDetails: { error: h.error, cause: h.cause } } : {}),
      ...(h.type === 'ExecutionAborted' ? { executionAbortedEventDetails: { error: h.error, cause: h.cause } } : {}),
      ...(h.type === 'ExecutionTimedOut' ? { executionTimedOutEventDetails: { error: h.error, cause: h.cause } } : {}),
    }));
    return reverseOrder ? events.reverse() : events;
  }

  /** `ListExecutions`: "Results are sorted by time, with the most recent execution first." */
  public listExecutions(stateMachineArn: string, statusFilter?: string, redriveFilter?: string): Array<Record<string, unknown>> {
    refusePendingRedrive(statusFilter);
    return [...this.executions.values()]
      .filter((e) => e.stateMachine.arn === stateMachineArn && (!statusFilter || e.status === statusFilter))
      .filter((e) => !redriveFilter || (redriveFilter === 'REDRIVEN') === e.redriveCount > 0)
      .reverse()
      .map((e) => ({
        executionArn: e.arn,
        stateMachineArn,
        name: e.name,
        status: e.status,
        startDate: e.startDate / 1000,
        ...(e.stopDate !== undefined ? { stopDate: e.stopDate / 1000 } : {}),
        redriveCount: e.redriveCount,
      }));
  }

  /** `SendTaskSuccess`: the task waiting on `taskToken` ends with `output` (JSON text). */
  public sendTaskSuccess(taskToken: string, output: string): void {
    this.callbacks.sendTaskSuccess(taskToken, output);
  }

  /** `SendTaskFailure`: the task waiting on `taskToken` fails with `error` and `cause`. */
  public sendTaskFailure(taskToken: string, error?: string, cause?: string): void {
    this.callbacks.sendTaskFailure(taskToken, error, cause);
  }

  /** `SendTaskHeartbeat`: the task waiting on `taskToken` starts its HeartbeatSeconds afresh. */
  public sendTaskHeartbeat(taskToken: string): void {
    this.callbacks.sendTaskHeartbeat(taskToken);
  }

  private startExecutionApi(stateMachineArn: string, input?: string, name?: string): Record<string, unknown> {
    const sm = [...this.stateMachines.values()].find((s) => s.arn === stateMachineArn);
    if (!sm) {
      throw new ApiError('StateMachineDoesNotExist', `State Machine Does Not Exist: '${stateMachineArn}'`);
    }
    const e = this.startExecution(sm, input === undefined ? {} : JSON.parse(input), { name });
    return { executionArn: e.arn, startDate: e.startDate / 1000 };
  }

  // ---- internals ----

  private async startServices(): Promise<void> {
    this.codeDynamoDb = await CodeDynamoDbEndpoint.start(this.db, this.dynamo, this.options.staleReads !== undefined);
    this.sfnApi = await StepFunctionsApi.start({
      describeExecution: (arn) => this.describeExecutionAsSeen(arn),
      stopExecution: (arn, error, cause) => this.stopExecution(arn, error, cause),
      startExecution: (arn, input, name) => this.startExecutionApi(arn, input, name),
      listExecutions: (arn, status, redrive) => this.listExecutionsAsSeen(arn, status, redrive),
      sendTaskSuccess: (token, output) => this.sendTaskSuccess(token, output),
      sendTaskFailure: (token, error, cause) => this.sendTaskFailure(token, error, cause),
      sendTaskHeartbeat: (token) => this.sendTaskHeartbeat(token),
      getExecutionHistory: (arn, reverse) => this.getExecutionHistory(arn, reverse),
    });
    // Code under test reaches the simulation through the SDK's standard configuration.
    this.setEnv({
      AWS_REGION: REGION,
      AWS_ACCESS_KEY_ID: 'local',
      AWS_SECRET_ACCESS_KEY: 'local',
      AWS_ENDPOINT_URL_DYNAMODB: this.codeDynamoDb.endpoint,
      AWS_ENDPOINT_URL_SFN: this.sfnApi.endpoint,
      SIM_TIME_SCALE: String(this.timeScale),
    });
    if (this.options.schedules ?? true) {
      for (const rule of this.rules.filter((r) => r.scheduleSeconds !== undefined)) {
        const tick = () => {
          trackedTimeout(
            this.timers,
            () => {
              void this.deliverToTargets(rule, this.scheduledEvent(rule), false);
              tick();
            },
            rule.scheduleSeconds! * 1000 * this.timeScale,
          );
        };
        tick();
      }
    }
  }

  private setEnv(vars: Record<string, string>): void {
    for (const [k, v] of Object.entries(vars)) {
      if (!(k in this.savedEnv)) this.savedEnv[k] = process.env[k];
      process.env[k] = v;
    }
  }

  private scheduledEvent(rule: SimRule): Record<string, unknown> {
    return {
      'version': '0',
      'id': `scheduled-${Date.now()}-${Math.floor(this.random() * 1e9)}`,
      'detail-type': 'Scheduled Event',
      'source': 'aws.events',
      'account': ACCOUNT,
      'time': new Date(this.now()).toISOString(),
      'region': REGION,
      'resources': [rule.arn],
      'detail': {},
    };
  }

  private deliverToTargets(rule: SimRule, event: Record<string, unknown>, withFaults: boolean): Array<Promise<void>> {
    const deliveries: Array<Promise<void>> = [];
    for (const target of rule.targets) {
      if (withFaults && chance(this.random, this.eventFaults.lossRate ?? 0)) {
        this.lostEvents++;
        continue;
      }
      const copies = withFaults && chance(this.random, this.eventFaults.duplicateRate ?? 0) ? 2 : 1;
      for (let i = 0; i < copies; i++) {
        const delay = withFaults ? this.random() * (this.eventFaults.maxDelaySeconds ?? 0) : 0;
        const delivery = this.deliver(target, event, delay, rule.logicalId);
        this.track(delivery);
        deliveries.push(delivery);
      }
    }
    return deliveries;
  }

  private track(promise: Promise<unknown>): void {
    this.pending.add(promise);
    void promise.finally(() => this.pending.delete(promise));
  }

  private async deliver(target: SimTarget, event: Record<string, unknown>, delaySeconds: number, rule = ''): Promise<void> {
    if (delaySeconds > 0) await this.sleep(delaySeconds);
    const input = targetInput(target, event);
    const stateMachine = [...this.stateMachines.values()].find((sm) => sm.arn === target.Arn);
    if (stateMachine) {
      const started = await this.startWithRetries(target, rule, event, () => this.startExecution(stateMachine, input));
      if (started) await started.done;
      return;
    }
    const fn = [...this.resources.values()].find((r) => r.type === 'AWS::Lambda::Function' && r.attributes.Arn === target.Arn);
    if (fn) {
      await this.invokeAsync(fn, input);
      return;
    }
    throw new Error(`the simulator cannot deliver to rule target ${target.Arn}`);
  }

  private async run(execution: Execution, resume?: { definition: any; input: unknown }): Promise<void> {
    const runStarted = this.now();
    const timeoutSeconds: number | undefined = (resume ? resume.definition : execution.stateMachine.definition).TimeoutSeconds;
    const machine = resume
      ? new this.sfn.StateMachine(withTokenMarkers(resume.definition) as any, { validationOptions: { noValidate: true } })
      : this.interpreter(execution.stateMachine);
    const run = machine.run((resume ? resume.input : execution.input) as any, {
      overrides: { taskResourceLocalHandlers: this.taskOverrides(execution) },
      context: {
        Execution: {
          Id: execution.arn,
          Input: execution.input as any,
          Name: execution.name,
          RoleArn: `arn:aws:iam::${ACCOUNT}:role/${execution.stateMachine.logicalId}Role`,
          StartTime: new Date(execution.startDate).toISOString(),
          RedriveCount: execution.redriveCount,
          ...(execution.redriveDate !== undefined ? { RedriveTime: new Date(execution.redriveDate).toISOString() } : {}),
        },
        StateMachine: { Id: execution.stateMachine.arn, Name: execution.stateMachine.name },
        // `State` is set for each state entered (local-sfn.ts patch 11).
      },
    });
    execution.abortRun = run.abort;
    this.emitStatusChange(execution);

    const definitionStates = new Map(allStates(execution.stateMachine.definition));
    const inMap = new Set(
      [...definitionStates.values()].filter((st) => st.Type === 'Map').flatMap((st) => allStates(st.ItemProcessor ?? st.Iterator ?? {}).map(([n]) => n)),
    );
    const caught = new Set<string>();
    const counting = (async () => {
      for await (const event of run.eventLogs) {
        const loggedAt = this.simulatedTimeOf((event as { timestamp?: number }).timestamp);
        // The state a redrive starts a branch with is the simulator's, not the definition's: no transition, no history.
        if ('state' in event && (event as { state: { name: string } }).state.name.startsWith(REDRIVE_RESUME)) continue;
        const key = 'state' in event ? `${event.state.name}#${(event as { index?: number }).index ?? ''}` : '';
        const types = historyEventsOf(event as any, 'state' in event ? definitionStates.get(event.state.name) : undefined, caught.has(key));
        if (event.type === 'StateCaught') caught.add(key);
        else if (event.type === 'StateEntered') caught.delete(key);
        // Only the execution's success may be the 25,000th event (it is logged when the run ends).
        if (execution.historyEvents + types.length > HISTORY_EVENT_LIMIT - 1) {
          if (execution.historyLimitExceeded === undefined) {
            execution.historyLimitExceeded = HISTORY_LIMIT_CAUSE;
            execution.abortRun?.();
          }
        } else {
          // When the interpreter logged the event (not when this loop reads it, which can be seconds of
          // simulated time later), never before the history's last event.
          const last = execution.history[execution.history.length - 1]?.timestamp ?? -Infinity;
          const timestamp = Math.max(last, loggedAt);
          for (const type of types) {
            if (type.endsWith('StateEntered') && 'state' in event) {
              execution.history.push({ type, name: event.state.name, input: event.state.input, timestamp });
            } else if (type.endsWith('StateExited') && 'state' in event) {
              // The output is kept for a redrive: a Parallel branch that ended with it is not run again.
              execution.history.push({ type, state: event.state.name, output: event.state.output, timestamp });
            } else if (isTaskEvent(type) && 'state' in event) {
              // The task's own events: which call of its state they are about, and its error.
              // (Not inside a Map: its iterations call the same state at once, in no known order.)
              const name = event.state.name;
              let call: number | undefined;
              if (!inMap.has(name)) {
                if (type === 'TaskScheduled' || type === 'LambdaFunctionScheduled') execution.taskScheduled.set(name, (execution.taskScheduled.get(name) ?? 0) + 1);
                call = (execution.taskScheduled.get(name) ?? 0) - 1;
              }
              const failure = event.type === 'StateFailed' ? { error: (event as any).Error, cause: causeText((event as any).Cause) } : {};
              execution.history.push({ type, state: name, call, ...failure, timestamp });
            } else {
              execution.history.push({ type, ...('state' in event ? { state: event.state.name } : {}), timestamp });
            }
          }
        }
        if (event.type === 'StateEntered' || event.type === 'StateRetried') {
          execution.transitions++;
          const name = event.state.name;
          execution.stateTransitions.set(name, (execution.stateTransitions.get(name) ?? 0) + 1);
          if (event.type === 'StateEntered') {
            this.stateListeners.forEach((l) => l(execution, name, loggedAt));
          }
        } else if (event.type === 'StateExited' && execution.dataLimitExceeded === undefined) {
          const exceeded = payloadOverQuota(event.state.name, 'an output', event.state.output);
          if (exceeded) {
            execution.dataLimitExceeded = exceeded;
            execution.abortRun?.();
          }
        }
      }
    })();

    type RunError = Error & { cause?: Error };
    let outcome: { output: unknown } | { error: RunError };
    try {
      outcome = { output: await run.result };
    } catch (e) {
      outcome = { error: e as RunError };
    }
    // Every event of the run counted (the interpreter hands them over a moment late): was the limit passed?
    await counting;
    if ('output' in outcome && execution.historyLimitExceeded === undefined && execution.dataLimitExceeded === undefined) {
      execution.output = outcome.output;
      execution.status = 'SUCCEEDED';
    } else {
      const err: RunError = 'error' in outcome ? outcome.error : (new Error() as RunError);
      if (execution.historyLimitExceeded !== undefined) {
        execution.status = 'FAILED';
        execution.error = 'States.Runtime';
        execution.cause = execution.historyLimitExceeded;
      } else if (execution.dataLimitExceeded !== undefined) {
        execution.status = 'FAILED';
        execution.error = 'States.DataLimitExceeded';
        execution.cause = execution.dataLimitExceeded;
      } else if (err.name === 'ExecutionAbortedError') {
        execution.status = 'ABORTED';
      } else if (err.name === 'ExecutionTimeoutError') {
        execution.status = 'TIMED_OUT';
        execution.error = 'States.Timeout';
      } else if (err.name === 'ExecutionError' && err.cause) {
        execution.status = 'FAILED';
        execution.error = err.cause.name;
        execution.cause = err.cause.message;
      } else {
        execution.status = 'FAILED';
        execution.error = err.name;
        execution.cause = err.message;
      }
    }
    // A timed-out execution stops at its deadline, as AWS records it: the scaled timer that noticed
    // can fire late on a loaded machine, which is not a time the execution ran.
    execution.stopDate = execution.status === 'TIMED_OUT' && timeoutSeconds !== undefined
      ? Math.min(this.now(), Math.max(runStarted + timeoutSeconds * 1000, execution.history[execution.history.length - 1].timestamp))
      : this.now();
    execution.statusLog.push({ at: execution.stopDate, status: execution.status, redriveCount: execution.redriveCount });
    execution.history.push({
      type: `Execution${{ SUCCEEDED: 'Succeeded', FAILED: 'Failed', ABORTED: 'Aborted', TIMED_OUT: 'TimedOut', RUNNING: '' }[execution.status]}`,
      timestamp: execution.stopDate,
      ...(execution.status === 'SUCCEEDED' ? { output: execution.output } : { error: execution.error, cause: execution.cause }),
    });
    execution.stopped.abort();
    this.stopListeners.forEach((l) => l(execution));
    this.emitStatusChange(execution);
    execution.finish();
  }

  /**
   * One interpreter per state machine, built (and its definition validated) once: validation compiles
   * a JSON schema, far too slow to repeat for every execution.
   */
  private interpreter(stateMachine: SimStateMachine): InstanceType<LocalStepFunctions['StateMachine']> {
    let machine = this.interpreters.get(stateMachine.arn);
    if (!machine) {
      machine = new this.sfn.StateMachine(withTokenMarkers(stateMachine.definition) as any, { validationOptions: { checkArn: false } });
      this.interpreters.set(stateMachine.arn, machine);
    }
    return machine;
  }

  /** A handler for every Task state of the definition, nested branches included. */
  private taskOverrides(execution: Execution): Record<string, (input: any) => Promise<any>> {
    const overrides: Record<string, (input: any) => Promise<any>> = {};
    for (const [stateName, state] of allStates(execution.stateMachine.definition)) {
      if (state.Type !== 'Task') continue;
      overrides[stateName] = async (input: any) => {
        // A stopped execution runs no more tasks. (The interpreter would otherwise run a pending
        // retry of a task after the abort; Step Functions does not.) The attempt fails at once rather
        // than never settling: the interpreter keeps a timer per task until it settles, which would
        // keep the process alive, and it runs no state after the abort whatever the task's outcome.
        if (execution.stopped.signal.aborted) return Promise.reject(executionStopped());
        try {
          return checkPayloadSize(stateName, 'a task result', await this.runTask(execution, stateName, state.Resource, input));
        } finally {
          this.taskEndListeners.forEach((l) => l(execution, stateName));
        }
      };
    }
    return overrides;
  }

  private async runTask(execution: Execution, stateName: string, resource: string, input: any): Promise<unknown> {
    const calls = execution.taskCalls.get(stateName) ?? [];
    execution.taskCalls.set(stateName, calls);
    const call: { parameters: unknown; output?: unknown } = { parameters: input };
    calls.push(call);
    const output = await this.callTask(execution, stateName, resource, input, call);
    call.output = output;
    return output;
  }

  private async callTask(execution: Execution, stateName: string, resource: string, input: any, call: { parameters: unknown }): Promise<unknown> {
    const context: TaskContext = { simulator: this, execution, stateName, signal: execution.stopped.signal };
    this.taskListeners.forEach((l) => l(execution, stateName));
    if (resource.endsWith(WAIT_FOR_TASK_TOKEN)) {
      return this.runCallbackTask(execution, stateName, resource, input, context, call);
    }
    checkPayloadSize(stateName, 'an input after Parameters', input);
    const override = this.options.taskHandlers?.[stateName];
    if (override) {
      return override(input, context);
    }
    return this.dispatch(execution, stateName, resource, input, context);
  }

  /**
   * A `.waitForTaskToken` task: a token for this attempt, the call with it, then the wait for the
   * callback. The wait is registered before the call, so that a callback sent while the call is
   * still under way is not lost.
   */
  private async runCallbackTask(
    execution: Execution,
    stateName: string,
    resource: string,
    input: any,
    context: TaskContext,
    record: { parameters: unknown },
  ): Promise<unknown> {
    const token = this.callbacks.issue(execution.arn, stateName);
    const state = allStates(execution.stateMachine.definition).find(([name]) => name === stateName)![1];
    const callback = this.callbacks.wait(
      token,
      execution.arn,
      stateName,
      { heartbeatSeconds: state.HeartbeatSeconds, timeoutSeconds: state.TimeoutSeconds },
      execution.stopped.signal,
    );
    // The callback can come before the call has returned; the task takes its outcome after that.
    callback.catch(() => undefined);
    const call = withToken(input, token);
    // Its parameters as the history gives them: with the token.
    record.parameters = call;
    try {
      checkPayloadSize(stateName, 'an input after Parameters', call);
      const override = this.options.taskHandlers?.[stateName];
      await (override ? override(call, context) : this.dispatch(execution, stateName, resource.slice(0, -WAIT_FOR_TASK_TOKEN.length), call, context));
    } catch (e) {
      this.callbacks.close(token);
      throw e;
    }
    return callback;
  }

  private async dispatch(execution: Execution, stateName: string, resource: string, input: any, context: TaskContext): Promise<unknown> {
    if (DynamoTaskRunner.handles(resource)) {
      execution.dynamoCalls++;
      return this.dynamo.run(resource, input, (units) => {
        execution.writeUnits += units.write;
        execution.readUnits += units.read;
      });
    }
    if (resource.startsWith('arn:aws:states:::aws-sdk:sfn:') && chance(this.random, this.options.sfnThrottleRate ?? 0)) {
      this.throttledSfnCalls++;
      return sdkIntegrationCall('Sfn', () => {
        throw new ApiError('ThrottlingException', 'Rate exceeded');
      });
    }
    if (resource === 'arn:aws:states:::aws-sdk:sfn:describeExecution') {
      return sdkIntegrationCall('Sfn', () => pascalKeys(this.describeExecutionAsSeen(input.ExecutionArn)));
    }
    if (resource === 'arn:aws:states:::aws-sdk:sfn:stopExecution') {
      return sdkIntegrationCall('Sfn', () => pascalKeys(this.stopExecution(input.ExecutionArn, input.Error, input.Cause)));
    }
    if (resource === 'arn:aws:states:::aws-sdk:sfn:sendTaskSuccess') {
      if (chance(this.random, this.options.lostWakeUpRate ?? 0)) {
        this.lostWakeUps++;
        return {};
      }
      return sdkIntegrationCall('Sfn', () => (this.sendTaskSuccess(input.TaskToken, input.Output), {}));
    }
    if (resource === 'arn:aws:states:::aws-sdk:sfn:sendTaskFailure') {
      return sdkIntegrationCall('Sfn', () => (this.sendTaskFailure(input.TaskToken, input.Error, input.Cause), {}));
    }
    if (resource === 'arn:aws:states:::aws-sdk:sfn:sendTaskHeartbeat') {
      return sdkIntegrationCall('Sfn', () => (this.sendTaskHeartbeat(input.TaskToken), {}));
    }
    if (resource === 'arn:aws:states:::lambda:invoke' || resource.startsWith('arn:aws:lambda:')) {
      if (chance(this.random, this.options.lambdaServiceErrorRate ?? 0)) {
        const name = LAMBDA_SERVICE_ERRORS[Math.floor(this.random() * LAMBDA_SERVICE_ERRORS.length)];
        throw new TaskError(name, `${name.slice('Lambda.'.length)}: the Lambda service failed the invocation (injected)`);
      }
    }
    if (resource === 'arn:aws:states:::lambda:invoke') {
      const payload = await this.invokeLambda(this.functionByArnOrName(String(input.FunctionName)), input.Payload, context);
      return { ExecutedVersion: '$LATEST', Payload: payload, StatusCode: 200 };
    }
    if (resource.startsWith('arn:aws:lambda:')) {
      return this.invokeLambda(this.functionByArnOrName(resource), input, context);
    }
    throw new Error(`the simulator has no handler for task '${stateName}' (${resource})`);
  }

  private functionByArnOrName(functionArnOrName: string): PhysicalResource {
    const fn = [...this.resources.values()].find(
      (r) => r.type === 'AWS::Lambda::Function' && (r.attributes.Arn === functionArnOrName || r.ref === functionArnOrName),
    );
    if (!fn) throw new Error(`no Lambda function ${functionArnOrName} in the stack`);
    return fn;
  }

  /** Invoke a function: the registered handler, or its synthesized code. Errors as Step Functions sees them. */
  private async invokeLambda(fn: PhysicalResource, payload: unknown, taskContext?: TaskContext): Promise<unknown> {
    this.lambdaInvocations.set(fn.logicalId, (this.lambdaInvocations.get(fn.logicalId) ?? 0) + 1);
    const registered = this.options.lambdaHandlers?.[fn.logicalId];
    const props = this.template.Resources[fn.logicalId].Properties ?? {};
    const timeoutSeconds = Number(props.Timeout ?? 3);
    const deadline = this.now() + timeoutSeconds * 1000;
    const awsRequestId = `req-${Math.floor(this.random() * 1e12)}`;
    // The function's Timeout, registered handlers included: Lambda stops the function, and Step
    // Functions reports an error without a type.
    const timedOut = new AbortController();
    const withinTimeout = async (run: Promise<unknown>) => {
      const timer = this.sleep(timeoutSeconds, timedOut.signal).then(() =>
        timedOut.signal.aborted ? undefined : Promise.reject(lambdaTimedOut(awsRequestId, this.now(), timeoutSeconds)),
      );
      try {
        return await Promise.race([run, timer]);
      } finally {
        timedOut.abort();
      }
    };
    try {
      if (registered) {
        if (!taskContext) throw new Error(`registered handler of ${fn.logicalId} needs a task context`);
        return await withinTimeout(Promise.resolve(registered(payload, taskContext)));
      }
      this.setEnv(resolve(props.Environment?.Variables ?? {}, this.resources, this.stackName));
      let handler = this.lambdas.get(fn.logicalId);
      if (!handler) {
        const logs = this.lambdaLogs.get(fn.logicalId) ?? [];
        this.lambdaLogs.set(fn.logicalId, logs);
        handler = loadHandler(this.template.Resources[fn.logicalId], this.assemblyDir, () => this.now(), (line) => logs.push(line));
        this.lambdas.set(fn.logicalId, handler);
      }
      const context: LambdaContext = {
        functionName: fn.ref,
        awsRequestId,
        getRemainingTimeInMillis: () => Math.max(0, deadline - this.now()),
      };
      return await withinTimeout(handler(payload, context));
    } catch (e) {
      if (e instanceof TaskError) throw e;
      const err = e as Error;
      // As Step Functions reports an unhandled function error: the function's error type, and its
      // error object as the cause.
      throw new TaskError(err.name || 'Error', JSON.stringify({ errorType: err.name, errorMessage: err.message, trace: [] }));
    }
  }

  /**
   * EventBridge's delivery to a state machine: a failed StartExecution (`targetFailureRate`) is retried
   * "with an exponential back off and jitter" for up to the target's MaximumRetryAttempts (185) and
   * MaximumEventAgeInSeconds (24 hours), then sent to its dead-letter queue, or dropped; either way it is
   * recorded in `undeliveredEvents`, never lost silently.
   * https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html
   */
  private async startWithRetries(
    target: SimTarget,
    rule: string,
    event: Record<string, unknown>,
    start: () => Execution,
  ): Promise<Execution | undefined> {
    const attempts = target.RetryPolicy?.MaximumRetryAttempts ?? 185;
    const maxAgeMs = (target.RetryPolicy?.MaximumEventAgeInSeconds ?? 86_400) * 1000;
    const first = this.now();
    for (let attempt = 0; ; attempt++) {
      if (!chance(this.random, this.eventFaults.targetFailureRate ?? 0)) return start();
      this.failedTargetDeliveries++;
      if (attempt >= attempts || this.now() - first >= maxAgeMs) {
        this.undeliveredEvents.push({ rule, target: target.Arn, deadLetterQueue: target.DeadLetterConfig?.Arn, event });
        return undefined;
      }
      await this.sleep(this.random() * Math.min(2 ** attempt, 300));
    }
  }

  /**
   * An asynchronous invocation (how EventBridge invokes a function): Lambda invokes a function that
   * failed again, twice by default (its EventInvokeConfig's MaximumRetryAttempts), about one and then
   * two minutes later; an event that fails every attempt goes to the function's dead-letter queue or
   * on-failure destination (here: `asyncFailures`), or is dropped.
   * https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html
   */
  private async invokeAsync(fn: PhysicalResource, event: unknown): Promise<void> {
    const config = Object.values(this.template.Resources).find((r) => {
      if (r.Type !== 'AWS::Lambda::EventInvokeConfig') return false;
      const name = resolve(r.Properties?.FunctionName, this.resources, this.stackName);
      return name === fn.ref || name === fn.attributes.Arn;
    });
    const retries = Number(config?.Properties?.MaximumRetryAttempts ?? 2);
    for (let attempt = 0; ; attempt++) {
      try {
        await this.invokeLambda(fn, event);
        return;
      } catch (e) {
        if (attempt >= retries) {
          this.asyncFailures.push({ functionLogicalId: fn.logicalId, event, error: (e as Error).name });
          return;
        }
        await this.sleep(60 * (attempt + 1));
      }
    }
  }

  /** "Step Functions Execution Status Change", as documented in the Step Functions developer guide. */
  private emitStatusChange(e: Execution): void {
    if (e.stateMachine.type === 'EXPRESS') return;
    const input = JSON.stringify(e.input);
    // EventBridge events are at most 256 KiB; Step Functions leaves out payloads above 248 KiB.
    const inputIncluded = input.length <= 248 * 1024;
    const output = e.status === 'SUCCEEDED' ? JSON.stringify(e.output) : null;
    const event = {
      'version': '0',
      'id': `event-${this.events.length + 1}`,
      'detail-type': 'Step Functions Execution Status Change',
      'source': 'aws.states',
      'account': ACCOUNT,
      'time': new Date(this.now()).toISOString(),
      'region': REGION,
      'resources': [e.arn],
      'detail': {
        executionArn: e.arn,
        stateMachineArn: e.stateMachine.arn,
        name: e.name,
        status: e.status,
        startDate: e.startDate,
        stopDate: e.stopDate ?? null,
        redriveCount: e.redriveCount,
        input: inputIncluded ? input : null,
        output,
        inputDetails: { included: inputIncluded },
        outputDetails: output === null ? null : { included: true },
        error: e.error ?? null,
        cause: e.cause ?? null,
      },
    };
    this.events.push(event);
    this.putEvent(event);
  }
}

/**
 * The DynamoDB actions the simulator's DynamoDB lacks: dynalite serves the item, batch, query and scan
 * actions, and the simulator the transactions (transactions.ts); nobody PartiQL.
 */
const DYNALITE_LACKS = ['executeStatement', 'executeTransaction', 'batchExecuteStatement'];

/** The table of which integration pattern each service integration supports. */
const INTEGRATION_PATTERNS_URL = 'https://docs.aws.amazon.com/step-functions/latest/dg/integrate-optimized.html';

type Pattern = 'sync' | 'waitForTaskToken';

/**
 * The patterns beside Request Response that each optimized integration supports in Standard workflows,
 * by the service's name in `arn:aws:states:::<service>:<action>`, as AWS's table gives them per service
 * (INTEGRATION_PATTERNS_URL). `.sync:2` is Step Functions' StartExecution only. The AWS SDK integrations
 * (`aws-sdk:`) support `.waitForTaskToken` and never `.sync`; the HTTP Task, Request Response only.
 */
const OPTIMIZED_PATTERNS: Record<string, Pattern[]> = {
  'apigateway': ['waitForTaskToken'],
  'athena': ['sync'],
  'batch': ['sync'],
  'bedrock': ['sync', 'waitForTaskToken'],
  'codebuild': ['sync'],
  'dynamodb': [],
  'ecs': ['sync', 'waitForTaskToken'],
  'eks': ['sync', 'waitForTaskToken'],
  'elasticmapreduce': ['sync'],
  'emr-containers': ['sync'],
  'emr-serverless': ['sync'],
  'events': ['waitForTaskToken'],
  'glue': ['sync'],
  'databrew': ['sync'],
  'lambda': ['waitForTaskToken'],
  'mediaconvert': ['sync'],
  'sagemaker': ['sync'],
  'sns': ['waitForTaskToken'],
  'sqs': ['waitForTaskToken'],
  'states': ['sync', 'waitForTaskToken'],
  'http': [],
  'aws-sdk': ['waitForTaskToken'],
};

/**
 * Why AWS refuses a Task's resource for its integration pattern, or undefined if it accepts it (or the
 * service is not in the table: then the simulator has no handler for it either, and says so when the
 * task runs). Checked per service, as AWS's table gives it; an action of a service that supports fewer
 * patterns than its service is not known here.
 */
export function unsupportedPattern(resource: string): string | undefined {
  const match = /^arn:aws[a-z-]*:states:::([a-z0-9-]+):([A-Za-z0-9:.-]+?)(?:\.(sync|waitForTaskToken)(:2)?)?$/.exec(resource);
  if (!match) return undefined;
  const [, service, action, pattern, version] = match;
  const supported = OPTIMIZED_PATTERNS[service];
  if (!supported) return undefined;
  const integration = service === 'aws-sdk' ? `the AWS SDK integration ${action}` : `the optimized ${service} integration`;
  if (version !== undefined && !(service === 'states' && pattern === 'sync' && action === 'startExecution')) {
    return `${integration} has no .${pattern}:2 (only Step Functions' startExecution.sync:2 does)`;
  }
  if (pattern !== undefined && !supported.includes(pattern as Pattern)) {
    const patterns = ['Request Response', ...supported.map((p) => `.${p}`)].join(' and ');
    return `${integration} supports ${patterns} only, not .${pattern}`;
  }
  return undefined;
}

/**
 * What the simulator cannot run, or what AWS refuses at creation, refused when the simulator starts,
 * naming the state machine and the state, rather than run differently from AWS:
 * - JSONata (aws-local-stepfunctions interprets JSONPath only);
 * - DynamoDB actions and parameters dynalite lacks (PartiQL, `ReturnValuesOnConditionCheckFailure` outside a transaction);
 * - an integration pattern the integration does not support (unsupportedPattern): `.waitForTaskToken`
 *   on the optimized DynamoDB integration, `.sync` on an AWS SDK integration, ...;
 * - `.waitForTaskToken` and `.sync` in an Express state machine, which supports neither
 *   (https://docs.aws.amazon.com/step-functions/latest/dg/choosing-workflow-type.html);
 * - with `staleReads`, an eventually consistent DynamoDB read, which dynalite cannot answer stale.
 */
export function refuseWhatItCannotRun(logicalId: string, definition: any, type?: string, staleReads = false): void {
  const refuse = (state: string | undefined, what: string) => {
    throw new Error(`the simulator cannot run state machine ${logicalId}${state === undefined ? '' : `, state '${state}'`}: ${what}`);
  };
  if (definition.QueryLanguage === 'JSONata') refuse(undefined, 'it uses JSONata, and the simulator interprets JSONPath only');
  for (const [name, state] of allStates(definition)) {
    if (state.QueryLanguage === 'JSONata') refuse(name, 'it uses JSONata, and the simulator interprets JSONPath only');
    // A Distributed Map's iterations are child executions (their own histories, events, quotas, Map Run
    // redrive); the interpreter would run them inline, as an inline Map.
    if (state.Type === 'Map' && (state.ItemProcessor?.ProcessorConfig?.Mode === 'DISTRIBUTED' || state.ItemReader || state.ResultWriter)) {
      refuse(name, 'a Distributed Map (child executions, ItemReader, ResultWriter): the simulator runs inline Map states only');
    }
    if (state.Type !== 'Task' || typeof state.Resource !== 'string') continue;
    const dynamo = /^arn:aws:states:::(aws-sdk:)?dynamodb:([A-Za-z]+)(\.[A-Za-z]+)?$/.exec(state.Resource);
    if (dynamo && DYNALITE_LACKS.includes(dynamo[2])) {
      refuse(name, `DynamoDB ${dynamo[2]} (PartiQL): the simulator's DynamoDB has no such action (it has the item, batch, query, scan and transaction actions)`);
    }
    // (A transaction's actions may ask for it: the simulator serves transactions itself.)
    if (dynamo && !dynamo[2].startsWith('transact') && JSON.stringify(state.Parameters ?? {}).includes('"ReturnValuesOnConditionCheckFailure')) {
      refuse(name, 'ReturnValuesOnConditionCheckFailure: dynalite, the simulator\'s DynamoDB, would ignore it');
    }
    // With stale reads on, a DynamoDB read that is not strongly consistent could return the previous
    // version of an item on AWS; the simulator's DynamoDB (dynalite) always returns the latest.
    if (staleReads && dynamo && eventuallyConsistentRead(`${dynamo[2][0].toUpperCase()}${dynamo[2].slice(1)}`, state.Parameters ?? {})) {
      refuse(name, `an eventually consistent DynamoDB ${dynamo[2]}: with staleReads on, the simulator would answer it with the latest version only (set ConsistentRead, or test it on AWS)`);
    }
    const unsupported = unsupportedPattern(state.Resource);
    if (unsupported) refuse(name, `${unsupported} (AWS refuses the definition; ${INTEGRATION_PATTERNS_URL})`);
    if (type === 'EXPRESS' && /\.(waitForTaskToken|sync)(:2)?$/.test(state.Resource)) {
      refuse(name, 'an Express state machine supports neither .waitForTaskToken nor .sync (AWS refuses the definition)');
    }
  }
}

/** A description (or a listed execution) as it was when its execution had `view`'s status and run. */
function staleDescription(current: Record<string, unknown>, view: { status: ExecutionStatus; redriveCount: number }): Record<string, unknown> {
  const { stopDate, output, outputDetails, error, cause, ...rest } = current;
  const ended = view.status !== 'RUNNING';
  const same = view.status === current.status && view.redriveCount === current.redriveCount;
  return {
    ...rest,
    status: view.status,
    redriveCount: view.redriveCount,
    // An ended run's details are its own only if it is the run now shown; an earlier run's are gone.
    ...(ended && same ? { stopDate, output, outputDetails, error, cause } : {}),
  };
}

/**
 * PENDING_REDRIVE is a status of a Distributed Map's child executions only: "If you provide a
 * stateMachineArn and a PENDING_REDRIVE statusFilter, the API returns a validation exception"
 * (https://docs.aws.amazon.com/step-functions/latest/apireference/API_ListExecutions.html).
 */
function refusePendingRedrive(statusFilter: string | undefined): void {
  if (statusFilter === 'PENDING_REDRIVE') {
    throw new ApiError('ValidationException', 'A PENDING_REDRIVE statusFilter requires a mapRunArn, not a stateMachineArn');
  }
}

/** Lambda service errors Step Functions advises to retry (`lambdaServiceErrorRate`). */
const LAMBDA_SERVICE_ERRORS = ['Lambda.ServiceException', 'Lambda.AWSLambdaException', 'Lambda.SdkClientException', 'Lambda.TooManyRequestsException'];

/**
 * A function that ran past its Timeout: Lambda returns only an error message, and Step Functions names
 * the error `Lambda.Unknown` ("The cause could not be determined because Lambda did not return an
 * error type", as executions on AWS report it).
 */
function lambdaTimedOut(requestId: string, now: number, seconds: number): TaskError {
  const payload = JSON.stringify({ errorMessage: `${new Date(now).toISOString()} ${requestId} Task timed out after ${seconds.toFixed(2)} seconds` });
  return new TaskError('Lambda.Unknown', `The cause could not be determined because Lambda did not return an error type. Returned payload: ${payload}`);
}

/** Every state of a definition, nested Parallel branches and Map iterators included. */
export function allStates(definition: any): Array<[string, any]> {
  const result: Array<[string, any]> = [];
  for (const [name, state] of Object.entries<any>(definition.States ?? {})) {
    result.push([name, state]);
    for (const branch of state.Branches ?? []) result.push(...allStates(branch));
    if (state.Iterator) result.push(...allStates(state.Iterator));
    if (state.ItemProcessor) result.push(...allStates(state.ItemProcessor));
  }
  return result;
}

type HistoryEntry = Execution['history'][number];

/**
 * How `RedriveExecution` resumes an execution, as AWS documents it: "Redrive ... restarts the execution
 * from the unsuccessful step" with that step's input, and "for Parallel states, redrive only reruns
 * the failed or aborted branches" (https://docs.aws.amazon.com/step-functions/latest/dg/redrive-executions.html).
 * The definition is rewritten: the execution starts at the top-level state that failed or encloses the
 * failure; in each enclosing Parallel, a branch that ended is replaced by a Pass state giving its recorded
 * output, and an unsuccessful branch starts with a Pass state giving its unsuccessful state's input
 * (these Pass states, named REDRIVE_RESUME..., make no transition and no history). Map iterations are
 * refused: the interpreter keeps no iteration's outcome.
 */
class RedrivePlan {
  /** Branches not run again, by `parallel#branch`, with their output: the next redrive skips them too. */
  public readonly skipped = new Map<string, unknown>();
  private resumes = 0;

  constructor(
    private readonly history: HistoryEntry[],
    private readonly previouslySkipped: Map<string, unknown>,
  ) {}

  /** Rewrites `definition` to resume the run whose events follow history index `since`; returns the run's input. */
  public resumeExecution(definition: any, since: number): unknown {
    const last = this.lastEntered(definition, since);
    if (!last) throw new Error('the simulator cannot redrive an execution that entered no state');
    const top = topLevelStateOf(definition, last.name);
    definition.StartAt = top;
    if (top === last.name) return last.input;
    const entry = this.lastEntryOf(top, since);
    this.resumeParallel(definition.States[top], top, entry.index);
    return entry.input;
  }

  private resumeParallel(parallel: any, parallelName: string, since: number): void {
    parallel.Branches.forEach((branch: any, index: number) => {
      const key = `${parallelName}#${index}`;
      const last = this.lastEntered(branch, since);
      const ended = last ? this.endedWith(branch, last) : this.previouslySkipped.has(key) ? { output: this.previouslySkipped.get(key) } : undefined;
      const resume = `${REDRIVE_RESUME} ${++this.resumes}`;
      if (ended) {
        this.skipped.set(key, ended.output);
        branch.States[resume] = { Type: 'Pass', Result: ended.output, End: true };
      } else if (last) {
        const top = topLevelStateOf(branch, last.name);
        let input = last.input;
        if (top !== last.name) {
          const entry = this.lastEntryOf(top, since);
          this.resumeParallel(branch.States[top], top, entry.index);
          input = entry.input;
        }
        branch.States[resume] = { Type: 'Pass', Result: input, Next: top };
      } else {
        return; // never started: it runs from its start
      }
      branch.StartAt = resume;
    });
  }

  /** The last state of `scope` (at any depth) entered after history index `since`. */
  private lastEntered(scope: any, since: number): { index: number; name: string; input: unknown } | undefined {
    const names = new Set(allStates(scope).map(([name]) => name));
    for (let i = this.history.length - 1; i > since; i--) {
      const h = this.history[i];
      if (h.type.endsWith('StateEntered') && names.has(h.name!)) return { index: i, name: h.name!, input: h.input };
    }
    return undefined;
  }

  /** The last entry of the state `name` after history index `since` (the caller knows there is one). */
  private lastEntryOf(name: string, since: number): { index: number; name: string; input: unknown } {
    return this.lastEntered({ States: { [name]: {} } }, since)!;
  }

  /**
   * The output a branch ended with: its last state entered is one of its end states, and exited (a
   * caught end state would have been followed by its catcher's state).
   */
  private endedWith(branch: any, last: { index: number; name: string }): { output: unknown } | undefined {
    const state = branch.States[last.name];
    if (state === undefined || (state.End !== true && state.Type !== 'Succeed')) return undefined;
    const exit = this.history.slice(last.index + 1).find((h) => h.type.endsWith('StateExited') && h.state === last.name);
    return exit ? { output: exit.output } : undefined;
  }
}

/** The state of `scope`'s top level that is `stateName` or encloses it in a Parallel branch; a Map iteration's is refused. */
function topLevelStateOf(scope: any, stateName: string): string {
  for (const [name, state] of Object.entries<any>(scope.States ?? {})) {
    if (name === stateName) return name;
    if ((state.Branches ?? []).some((branch: any) => allStates(branch).some(([n]) => n === stateName))) return name;
    if (allStates(state.ItemProcessor ?? state.Iterator ?? {}).some(([n]) => n === stateName)) {
      // AWS re-runs only the unsuccessful iterations, each with its recorded input; the interpreter
      // keeps no iteration's outcome, so the simulator refuses rather than run them all again.
      throw new Error(`the simulator cannot redrive an execution that stopped inside a Map iteration (state '${stateName}'): test Map redrives on AWS`);
    }
  }
  throw new Error(`state '${stateName}' is not in the definition`);
}

/** `rate(5 minutes)` in seconds. */
export function scheduleSeconds(expression: string): number {
  const m = /^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$/.exec(expression);
  if (!m) {
    throw new Error(`the simulator runs rate() schedules only, got: ${expression}`);
  }
  const unit = { minute: 60, minutes: 60, hour: 3600, hours: 3600, day: 86400, days: 86400 }[m[2]]!;
  return Number(m[1]) * unit;
}

/** Step Functions' payload quota: a state's input after Parameters, and its output, UTF-8 bytes. */
const PAYLOAD_QUOTA_BYTES = 256 * 1024;

/**
 * A task whose effective input (after Parameters) exceeds the quota fails with `States.DataLimitExceeded`
 * before it calls anything, as Step Functions does, and so does a task whose result (before
 * ResultSelector: a DescribeExecution of a large input, a Lambda that returns too much) exceeds it.
 * That error is terminal: `States.ALL` does not catch it (only a catcher naming it does; local-sfn.ts
 * patch 10), and it is never retried. Returns the payload.
 * A state whose output exceeds the quota fails the execution with that error too, a moment late: the
 * interpreter reports the output once the state has exited, so the next state may have begun.
 * https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html
 * https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html#service-limits-task-executions
 */
function checkPayloadSize<T>(stateName: string, what: string, payload: T): T {
  const exceeded = payloadOverQuota(stateName, what, payload);
  if (exceeded) {
    const error = new TaskError('States.DataLimitExceeded', exceeded);
    Object.defineProperty(error, 'isRetryable', { value: false });
    throw error;
  }
  return payload;
}

/** Why a state's payload passes the quota, or undefined when it does not. */
function payloadOverQuota(stateName: string, what: string, payload: unknown): string | undefined {
  const bytes = Buffer.byteLength(JSON.stringify(payload ?? null), 'utf8');
  return bytes > PAYLOAD_QUOTA_BYTES ? `The state '${stateName}' has ${what} of ${bytes} bytes, above the quota of ${PAYLOAD_QUOTA_BYTES} bytes` : undefined;
}

/**
 * Errors the Step Functions API model defines (its shapes). An AWS SDK integration names an error
 * `ServiceName.ErrorName` ("the resulting Error field will be composed of the service name and the
 * error name"); one the model does not define, such as ThrottlingException (a common error of every
 * AWS API, not a shape of this one), reaches the task as the service's base exception, `Sfn.SfnException`,
 * as AWS SDK integrations report `DynamoDb.DynamoDbException` for a DynamoDB error outside its model.
 * https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html
 */
const SFN_MODELED_ERRORS = new Set([
  'ExecutionAlreadyExists',
  'ExecutionDoesNotExist',
  'ExecutionLimitExceeded',
  'ExecutionNotRedrivable',
  'InvalidArn',
  'InvalidExecutionInput',
  'InvalidName',
  'InvalidOutput',
  'InvalidToken',
  'StateMachineDoesNotExist',
  'TaskDoesNotExist',
  'TaskTimedOut',
  'ValidationException',
]);

/** An AWS SDK integration's result: API field names in PascalCase; its errors prefixed by the service. */
function sdkIntegrationCall(service: 'Sfn', call: () => unknown): unknown {
  try {
    return call();
  } catch (e) {
    const err = e as Error;
    const name = SFN_MODELED_ERRORS.has(err.name) ? `${err.name}Exception`.replace(/ExceptionException$/, 'Exception') : `${service}Exception`;
    throw new TaskError(`${service}.${name}`, err.message);
  }
}

function pascalKeys(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(o).map(([k, v]) => [
      k[0].toUpperCase() + k.slice(1),
      v !== null && typeof v === 'object' && !Array.isArray(v) ? pascalKeys(v as Record<string, unknown>) : v,
    ]),
  );
}
