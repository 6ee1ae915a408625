import { App, CfnElement, Duration, Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { Execution, lockStates, Simulator, SimulatorOptions, TaskContext, waitingTickets } from '../simulator';
import { ConcurrencyControlledWorkflow, ConcurrencyControlledWorkflowProps } from '../src';
import { HOLDER_REDRIVE_COUNT, LOCK_KEY, TICKET_WAITER } from '../src/private/lock-schema';

/**
 * The work functions' Timeout: Lambda's longest (15 minutes), since the simulator enforces a function's
 * Timeout on handlers registered in its place too, and the tests' bodies hold executions for minutes.
 */
export const WORK_FUNCTION_TIMEOUT = Duration.minutes(15);

/** Start a simulator of `stack`, run `fn` with it, and stop it whatever happens. */
export async function simulate(stack: Stack, options: SimulatorOptions, fn: (sim: Simulator) => Promise<void>): Promise<void> {
  const sim = await Simulator.start(stack, options);
  try {
    await fn(sim);
  } finally {
    await sim.stop();
  }
}

/** A stack with one workflow whose body is a Lambda task ("Do Work") the simulator runs locally. */
export function workflowStack(props: Partial<ConcurrencyControlledWorkflowProps> = {}) {
  const app = new App();
  const stack = new Stack(app, 'TestStack');
  const workFunction = new lambda.Function(stack, 'WorkFunction', {
    runtime: lambda.Runtime.NODEJS_18_X,
    handler: 'index.handler',
    code: lambda.Code.fromInline('exports.handler = async (event) => event;'),
    timeout: WORK_FUNCTION_TIMEOUT,
  });
  const body = new tasks.LambdaInvoke(stack, 'Do Work', { lambdaFunction: workFunction, payloadResponseOnly: true });
  const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', { body, ...props });
  return { app, stack, workflow, workFunctionId: logicalId(workFunction.node.defaultChild as CfnElement) };
}

export function logicalId(element: CfnElement): string {
  return element.stack.getLogicalId(element);
}

export function stateMachineLogicalId(sm: sfn.StateMachine): string {
  return logicalId(sm.node.defaultChild as CfnElement);
}

/**
 * Work that takes `seconds` (simulated) and counts how many executions are inside it at once. It
 * fails when the input says `fail`, and stops early when its execution stops.
 */
export class WorkTracker {
  public inside = 0;
  public maxInside = 0;
  public runs = 0;
  public readonly byExecution = new Map<string, number>();
  /** When each execution's work started, simulated epoch ms. */
  public readonly startedAt = new Map<string, number>();
  /** Every start of the work (redriven runs included), simulated epoch ms, in order. */
  public readonly starts: number[] = [];

  /** `seconds` gets the input and which run of the work this is for its execution (1, then 2 after a redrive...). */
  constructor(private readonly seconds: (input: any, run: number) => number = () => 1) {}

  public handler = async (input: any, context: TaskContext) => {
    this.runs++;
    const run = (this.byExecution.get(context.execution.arn) ?? 0) + 1;
    this.byExecution.set(context.execution.arn, run);
    this.startedAt.set(context.execution.arn, context.simulator.now());
    this.starts.push(context.simulator.now());
    this.inside++;
    this.maxInside = Math.max(this.maxInside, this.inside);
    try {
      await context.simulator.sleep(this.seconds(input, run), context.signal);
      // Stopped inside the body on its first run; a redriven run works to the end.
      if (input?.abortInside && run === 1) {
        context.execution.abort();
        await context.simulator.sleep(1e6, context.signal);
      }
      if (input?.fail) {
        const error = new Error(`work failed for ${context.execution.name}`);
        error.name = 'WorkFailed';
        throw error;
      }
      return { worked: true, echo: input };
    } finally {
      this.inside--;
    }
  };
}

/** The lock items of a table, as plain objects: name, permits in use, holders (executions by their ARNs). */
export async function lockState(sim: Simulator, table = 'WorkflowLockTable') {
  return (await lockStates(sim, table)).map((lock) => ({ ...lock, holders: lock.holders.map((h) => sim.executionOfHolder(h)?.arn ?? h) }));
}

/** A lock item as the table holds it (undefined before the first acquire); by default workflowStack's lock. */
export async function lockItem(sim: Simulator, lockName = 'TestStack/Workflow', table = 'WorkflowLockTable') {
  return (await sim.scan(table)).find((i) => i[LOCK_KEY]?.S === lockName);
}

export function statuses(executions: Execution[]): Record<string, number> {
  const result: Record<string, number> = {};
  for (const e of executions) result[e.status] = (result[e.status] ?? 0) + 1;
  return result;
}

/**
 * The waiters of a lock's queue in ticket order: each unserved ticket item past the lock's head, with
 * the waiter on it (an execution by its ARN) and the run that waits.
 */
export async function queuedWaiters(sim: Simulator, lockName: string, table = 'WorkflowLockTable'): Promise<Array<[string, string]>> {
  return waitingTickets(await sim.scan(table), lockName).map((i) => [
    sim.executionOfHolder(i[TICKET_WAITER].S!)?.arn ?? i[TICKET_WAITER].S!,
    i[HOLDER_REDRIVE_COUNT].N!,
  ]);
}

/**
 * Wait, in real time, until `condition` holds: for what the simulator does on its own, where a fixed
 * simulated sleep can be too short on a busy machine.
 */
export async function until(condition: () => Promise<boolean> | boolean, what: string, timeoutMs = 20_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The cleanups of `execution`: runs of another state machine whose input (a status event) names it. */
export function cleanupsOf(sim: Simulator, execution: Execution): Execution[] {
  return [...sim.executions.values()].filter((e) => e.stateMachine !== execution.stateMachine && JSON.stringify(e.input).includes(execution.arn));
}

/**
 * Wait, in real time, until at least `count` cleanups of `execution` have started and every one has
 * ended: for the effect of its status events, which a fixed simulated sleep can miss on a busy machine.
 */
export async function cleanupsEnded(sim: Simulator, execution: Execution, count: number): Promise<Execution[]> {
  const ended = () => {
    const cleanups = cleanupsOf(sim, execution);
    return cleanups.length >= count && cleanups.every((e) => e.status !== 'RUNNING');
  };
  await until(ended, `${count} cleanup(s) of ${execution.name} to end`);
  return cleanupsOf(sim, execution);
}
