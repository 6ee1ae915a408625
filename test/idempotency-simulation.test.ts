import { DynamoDBClient, PutItemCommand } from '@aws-sdk/client-dynamodb';
import { App, CfnElement, Duration, Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { lockState, logicalId, simulate, stateMachineLogicalId, statuses, until, WORK_FUNCTION_TIMEOUT, WorkTracker } from './helpers';
import { ApiError, Execution, Simulator, TaskContext } from '../simulator';
import { ConcurrencyControlledWorkflow, ConcurrencyControlledWorkflowProps, IdempotencyKey, IdempotencyOptions, IdempotentWorkflow } from '../src';

/*
 * Idempotent workflows, executed: the synthesized state machine (key function included, run from its
 * esbuild bundle) in the local simulator against dynalite.
 */

const BODY_STATES = new Set(['Do Work']);

function overhead(e: Execution): number {
  return [...e.stateTransitions].filter(([name]) => !BODY_STATES.has(name)).reduce((sum, [, n]) => sum + n, 0);
}

/** Until an execution is in its body (it claimed its record, and holds the permit): a head start a busy machine cannot run out. */
function inBody(execution: Execution): Promise<void> {
  return until(() => execution.stateTransitions.has('Do Work'), `${execution.name} in its body`);
}

/** A stack with one idempotent workflow (or, with `limit`, a concurrency-controlled one) around "Do Work". */
function idempotentStack(options: IdempotencyOptions = {}, limit?: number, semaphore: Partial<ConcurrencyControlledWorkflowProps> = {}) {
  const app = new App();
  const stack = new Stack(app, 'TestStack');
  const workFunction = new lambda.Function(stack, 'WorkFunction', {
    runtime: lambda.Runtime.NODEJS_18_X,
    handler: 'index.handler',
    code: lambda.Code.fromInline('exports.handler = async (event) => event;'),
    timeout: WORK_FUNCTION_TIMEOUT,
  });
  const body = new tasks.LambdaInvoke(stack, 'Do Work', { lambdaFunction: workFunction, payloadResponseOnly: true });
  const stateMachine =
    limit === undefined
      ? new IdempotentWorkflow(stack, 'Workflow', { body, ...options }).stateMachine
      : new ConcurrencyControlledWorkflow(stack, 'Workflow', { body, concurrencyLimit: limit, idempotency: options, ...semaphore }).stateMachine;
  return { stack, stateMachineId: stateMachineLogicalId(stateMachine), workFunctionId: logicalId(workFunction.node.defaultChild as CfnElement) };
}


/** The idempotency records, as plain objects. */
async function records(sim: Simulator) {
  const items = await sim.scan('WorkflowIdempotencyTable');
  return items.map((item) => ({ status: item.status?.S, owner: item.owner?.S, result: item.result?.S && JSON.parse(item.result.S) }));
}

describe('repeats', () => {
  test('a repeat returns the stored result without running the body; key order inside the input does not matter', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack();
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      // The note survives the round trip through the record as JSON text: quotes, backslash, unicode.
      const note = 'say "hi" \\ bye, ünïcode';
      const first = await sim.startExecution(sm, { order: 7, customer: { id: 'c1', tier: 'gold' }, note }).done;
      expect(first.status).toBe('SUCCEEDED');
      expect(first.output).toEqual({ worked: true, echo: { order: 7, customer: { id: 'c1', tier: 'gold' }, note } });
      // Beside the body: key, claim, body Parallel, save. Claim and save are the DynamoDB calls.
      expect(overhead(first)).toBe(4);
      expect(first.dynamoCalls).toBe(2);

      // The same input with its keys in another order, at both levels.
      const repeat = await sim.startExecution(sm, { note, customer: { tier: 'gold', id: 'c1' }, order: 7 }).done;
      expect(repeat.status).toBe('SUCCEEDED');
      expect(repeat.output).toEqual(first.output);
      expect(repeat.stateTransitions.get('Return Stored Result')).toBe(1);
      expect(repeat.stateTransitions.has('Do Work')).toBe(false);
      // Key, claim, read, check, return: the claim, the read and the result's own read are DynamoDB calls.
      expect(overhead(repeat)).toBe(5);
      expect(repeat.dynamoCalls).toBe(3);
      expect(work.runs).toBe(1);

      // Any difference in a value is another key: "7" is not 7.
      const other = await sim.startExecution(sm, { order: '7', customer: { id: 'c1', tier: 'gold' }, note }).done;
      expect(other.status).toBe('SUCCEEDED');
      expect(work.runs).toBe(2);
      expect((await records(sim)).map((r) => r.status)).toEqual(['SUCCEEDED', 'SUCCEEDED']);
    });
  });

  test('20 concurrent duplicates: the body runs once, every execution returns its result', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ duplicatePollInterval: Duration.seconds(4) });
    const work = new WorkTracker(() => 30);
    let executions: Execution[] = [];
    // The body starts only once the 19 duplicates wait for it: on a busy machine the first body could
    // otherwise end before the last duplicate started, which would find the result and not wait.
    const handler = async (input: unknown, context: TaskContext) => {
      await until(() => executions.filter((e) => e.stateTransitions.has('Wait For Duplicate')).length === 19, 'the duplicates waiting');
      return work.handler(input, context);
    };
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      executions = Array.from({ length: 20 }, () => sim.startExecution(sm, { job: 'nightly' }));
      await Promise.all(executions.map((e) => e.done));

      expect(statuses(executions)).toEqual({ SUCCEEDED: 20 });
      expect(work.runs).toBe(1);
      for (const e of executions) expect(e.output).toEqual({ worked: true, echo: { job: 'nightly' } });
      const waited = executions.filter((e) => e.stateTransitions.has('Wait For Duplicate'));
      expect(waited).toHaveLength(19);
      for (const e of waited) {
        // Each look at the record is a claim and a read; a poll adds the owner check, the count and the
        // wait; the result is read at the end.
        const polls = e.stateTransitions.get('Wait For Duplicate')!;
        expect(e.dynamoCalls).toBe(2 * (polls + 1) + 1);
        expect(overhead(e)).toBe(5 + 7 * polls);
      }
      // Jittered: the duplicates did not all poll at the same moments.
      const polls = new Set(waited.map((e) => e.stateTransitions.get('Wait For Duplicate')));
      expect(polls.size).toBeGreaterThan(1);
    });
  });

  test('after a failure the next execution runs the body again', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack();
    let calls = 0;
    const failOnce = async (input: unknown) => {
      if (calls++ === 0) {
        const error = new Error('first attempt failed');
        error.name = 'WorkFailed';
        throw error;
      }
      return { worked: true, echo: input };
    };
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: failOnce } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const failed = await sim.startExecution(sm, { job: 'j' }).done;
      expect(failed.status).toBe('FAILED');
      expect(failed.error).toBe('WorkFailed');
      expect((await records(sim)).map((r) => r.status)).toEqual(['FAILED']);

      const retry = await sim.startExecution(sm, { job: 'j' }).done;
      expect(retry.status).toBe('SUCCEEDED');
      expect(retry.output).toEqual({ worked: true, echo: { job: 'j' } });
      expect(calls).toBe(2);
      expect(await records(sim)).toEqual([{ status: 'SUCCEEDED', owner: retry.arn, result: retry.output }]);
    });
  });

  test('a record gone between a refused claim and its read (deleted by TTL): the execution claims again and runs the body', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack();
    const work = new WorkTracker();
    let deleteFirst = false;
    const taskHandlers = {
      'Read Idempotency Record': async (input: any, context: TaskContext) => {
        if (deleteFirst) {
          deleteFirst = false;
          await context.simulator.dynamo.run('arn:aws:states:::dynamodb:deleteItem', { TableName: input.TableName, Key: input.Key });
        }
        return context.simulator.dynamo.run('arn:aws:states:::dynamodb:getItem', input);
      },
    };
    await simulate(stack, { taskHandlers, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const first = await sim.startExecution(sm, { job: 'j' }).done;
      deleteFirst = true;
      const second = await sim.startExecution(sm, { job: 'j' }).done;

      expect([first.status, second.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
      // Refused (the record was there), read (gone by then), checked ("IsPresent": false), claimed again.
      const path = ['Claim Idempotency Record', 'Read Idempotency Record', 'Check Idempotency Record'];
      expect(path.map((s) => second.stateTransitions.get(s))).toEqual([2, 1, 1]);
      expect(second.stateTransitions.has('Return Stored Result')).toBe(false);
      expect(work.runs).toBe(2);
      expect(await records(sim)).toEqual([{ status: 'SUCCEEDED', owner: second.arn, result: second.output }]);
    });
  });

  test('records expire by timestamp: after expiresAfter the body runs again, although the item is still there', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ expiresAfter: Duration.minutes(1) });
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const first = await sim.startExecution(sm, { job: 'j' }).done;
      await sim.sleep(30);
      const within = await sim.startExecution(sm, { job: 'j' }).done;
      expect(within.stateTransitions.get('Return Stored Result')).toBe(1);
      expect(work.runs).toBe(1);

      // Counted from completion (at about 1 s): expired from about 61 s on.
      await sim.sleep(35);
      const after = await sim.startExecution(sm, { job: 'j' }).done;
      expect(after.status).toBe('SUCCEEDED');
      expect(after.stateTransitions.has('Return Stored Result')).toBe(false);
      expect(work.runs).toBe(2);
      // One item, rewritten by the later execution (dynalite, like DynamoDB TTL, had not removed it).
      expect(await records(sim)).toEqual([{ status: 'SUCCEEDED', owner: after.arn, result: after.output }]);
      expect(first.arn).not.toBe(after.arn);
    });
  });
});

describe('keys', () => {
  test('selected fields: other fields do not matter, a missing field counts as null, no field at all fails', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ key: IdempotencyKey.fromFields('$.orderId', "$.customer['id']") });
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const first = await sim.startExecution(sm, { orderId: 1, customer: { id: 'c' }, note: 'a' }).done;
      const repeat = await sim.startExecution(sm, { note: 'b', customer: { id: 'c', name: 'x' }, orderId: 1 }).done;
      expect(repeat.output).toEqual(first.output);
      expect(work.runs).toBe(1);

      await sim.startExecution(sm, { orderId: 2, customer: { id: 'c' } }).done;
      await sim.startExecution(sm, { orderId: 1 }).done;
      expect(work.runs).toBe(3);

      const missing = await sim.startExecution(sm, { somethingElse: true }).done;
      expect(missing.status).toBe('FAILED');
      expect(missing.error).toBe(IdempotentWorkflow.KEY_MISSING_ERROR);
      expect(work.runs).toBe(3);
    });
  });

  test('a JMESPath expression, as in the AWS sample', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ key: IdempotencyKey.fromJmesPath('[orderId, items[].sku]') });
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      await sim.startExecution(sm, { orderId: 1, items: [{ sku: 'a', qty: 1 }], at: 'mon' }).done;
      const repeat = await sim.startExecution(sm, { orderId: 1, items: [{ sku: 'a', qty: 5 }], at: 'tue' }).done;
      expect(repeat.stateTransitions.get('Return Stored Result')).toBe(1);
      await sim.startExecution(sm, { orderId: 1, items: [{ sku: 'b', qty: 1 }] }).done;
      expect(work.runs).toBe(2);
      // [null, []] is not a key that every input without an order id would share.
      const none = await sim.startExecution(sm, { customer: 'y' }).done;
      expect([none.status, none.error]).toEqual(['FAILED', IdempotentWorkflow.KEY_MISSING_ERROR]);
    });
  });

  test('payload validation: same key, different validated fields fails with IdempotencyValidationError', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ key: IdempotencyKey.fromFields('$.paymentId'), validateFields: ['$.amount'] });
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const first = await sim.startExecution(sm, { paymentId: 'p1', amount: 5, memo: 'x' }).done;
      const changed = await sim.startExecution(sm, { paymentId: 'p1', amount: 6 }).done;
      expect(changed.status).toBe('FAILED');
      expect(changed.error).toBe(IdempotentWorkflow.VALIDATION_ERROR);
      const same = await sim.startExecution(sm, { paymentId: 'p1', amount: 5, memo: 'y' }).done;
      expect(same.status).toBe('SUCCEEDED');
      expect(same.output).toEqual(first.output);
      expect(work.runs).toBe(1);
    });
  });
});

describe('dead first executions', () => {
  test('a first execution stopped inside the body does not block a retry', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack();
    const work: WorkTracker = new WorkTracker((_input, run): number => (work.runs === 1 && run === 1 ? 1000 : 1));
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      // Stopped once inside its body (waited for, not timed: a busy machine stretches the simulated seconds its states take).
      const first = sim.startExecution(sm, { job: 'j' });
      await inBody(first);
      first.abort();
      await first.done;
      expect(first.status).toBe('ABORTED');
      expect((await records(sim)).map((r) => r.status)).toEqual(['IN_PROGRESS']);

      const retry = await sim.startExecution(sm, { job: 'j' }).done;
      expect(retry.status).toBe('SUCCEEDED');
      expect(retry.stateTransitions.get('Take Over Idempotency Record')).toBe(1);
      expect(work.runs).toBe(2);
      expect(await records(sim)).toEqual([{ status: 'SUCCEEDED', owner: retry.arn, result: retry.output }]);
    });
  });

  test('a duplicate waiting for a first execution that is then stopped takes over and runs the body', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ duplicatePollInterval: Duration.seconds(5) });
    const work = new WorkTracker(() => 60);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const first = sim.startExecution(sm, { job: 'j' });
      await inBody(first);
      const duplicate = sim.startExecution(sm, { job: 'j' });
      // Stopped once the duplicate has waited for it twice (waited for, not timed).
      await until(() => (duplicate.stateTransitions.get('Wait For Duplicate') ?? 0) >= 2, 'the duplicate to wait twice');
      first.abort();
      await Promise.all([first.done, duplicate.done]);
      expect(first.status).toBe('ABORTED');
      expect(duplicate.status).toBe('SUCCEEDED');
      expect(duplicate.stateTransitions.get('Wait For Duplicate')).toBeGreaterThanOrEqual(2);
      expect(duplicate.stateTransitions.get('Take Over Idempotency Record')).toBe(1);
      expect(work.runs).toBe(2);
    });
  });
});

describe('records of running executions', () => {
  test('an IN_PROGRESS record never expires under a running execution: a late duplicate waits, the body never runs twice at once', async () => {
    const options = { expiresAfter: Duration.minutes(1), duplicatePollInterval: Duration.seconds(4) };
    const { stack, stateMachineId, workFunctionId } = idempotentStack(options);
    const work: WorkTracker = new WorkTracker((_input, run) => (work.runs === 1 && run === 1 ? 1000 : 100));
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const first = sim.startExecution(sm, { job: 'j' }, { abortAfterSeconds: 50 });
      await inBody(first);
      // Waits for the first, takes over when it is stopped (its record's expiry, from its start, is 62 s).
      const second = sim.startExecution(sm, { job: 'j' });
      await sim.sleep(68);
      // Taken over (waited for, not timed: a busy machine stretches the simulated seconds its polls take).
      await inBody(second);
      // Past both expiries, while the second still runs its 100 s body.
      const third = sim.startExecution(sm, { job: 'j' });
      await Promise.all([first.done, second.done, third.done]);

      expect([first.status, second.status, third.status]).toEqual(['ABORTED', 'SUCCEEDED', 'SUCCEEDED']);
      expect(second.stateTransitions.get('Take Over Idempotency Record')).toBe(1);
      expect(third.stateTransitions.has('Do Work')).toBe(false);
      expect(third.output).toEqual(second.output);
      expect(work.maxInside).toBe(1);
      expect(work.runs).toBe(2);
    });
  });

  test('validation is against records that count: a dead first execution\'s fields do not block a corrected retry', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ key: IdempotencyKey.fromFields('$.paymentId'), validateFields: ['$.amount'] });
    const work: WorkTracker = new WorkTracker((_input, run) => (work.runs === 1 && run === 1 ? 1000 : 1));
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      // Stopped once inside its body (waited for, not timed).
      const wrong = sim.startExecution(sm, { paymentId: 'p', amount: 5 });
      await inBody(wrong);
      wrong.abort();
      await wrong.done;
      const corrected = await sim.startExecution(sm, { paymentId: 'p', amount: 6 }).done;
      expect(corrected.status).toBe('SUCCEEDED');
      expect(corrected.stateTransitions.get('Take Over Idempotency Record')).toBe(1);
      // While a first execution runs, a duplicate with other validated fields is refused at once.
      const running = sim.startExecution(sm, { paymentId: 'q', amount: 1 }, { abortAfterSeconds: 500 });
      await inBody(running);
      const other = await sim.startExecution(sm, { paymentId: 'q', amount: 2 }).done;
      expect([other.status, other.error]).toEqual(['FAILED', IdempotentWorkflow.VALIDATION_ERROR]);
      expect(other.stateTransitions.has('Wait For Duplicate')).toBe(false);
      running.abort();
      await running.done;
    });
  });

  test('a duplicate gives up after duplicateWaitTimeout with IdempotencyDuplicateTimeout', async () => {
    const options = { duplicatePollInterval: Duration.seconds(4), duplicateWaitTimeout: Duration.seconds(30) };
    const { stack, stateMachineId, workFunctionId } = idempotentStack(options);
    const work = new WorkTracker(() => 1000);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const first = sim.startExecution(sm, { job: 'long' });
      await inBody(first);
      const duplicate = await sim.startExecution(sm, { job: 'long' }).done;
      expect([duplicate.status, duplicate.error]).toEqual(['FAILED', IdempotentWorkflow.DUPLICATE_TIMEOUT_ERROR]);
      // 30 s at three quarters of 4 s: 10 waits.
      expect(duplicate.stateTransitions.get('Wait For Duplicate')).toBe(10);
      first.abort();
      await first.done;
    });
  });
});

describe('owners DescribeExecution does not know', () => {
  test('an owner that does not exist is taken over when it is missing a second time, one poll later', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ duplicatePollInterval: Duration.seconds(5) });
    const work: WorkTracker = new WorkTracker((_input, run) => (work.runs === 1 && run === 1 ? 1000 : 1));
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      // Stopped once inside its body (waited for, not timed).
      const first = sim.startExecution(sm, { job: 'j' });
      await inBody(first);
      first.abort();
      await first.done;
      // The record now names an execution of this state machine that Step Functions has never heard of
      // (its history deleted 90 days after it ended, say).
      const ghost = first.arn.replace(/:[^:]+$/, ':ghost');
      const dynamodb = new DynamoDBClient({ endpoint: sim.db.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'local', secretAccessKey: 'local' } });
      const [record] = await sim.scan('WorkflowIdempotencyTable');
      await dynamodb.send(new PutItemCommand({ TableName: sim.tableName('WorkflowIdempotencyTable'), Item: { ...record, owner: { S: ghost } } }));

      const retry = await sim.startExecution(sm, { job: 'j' }).done;
      expect([retry.status, retry.error, retry.cause]).toEqual(['SUCCEEDED', undefined, undefined]);
      // Missing once: it waits a poll and looks again; missing again: it takes over.
      expect(retry.stateTransitions.get('Check Record Owner')).toBe(2);
      expect(retry.stateTransitions.get('Note Missing Record Owner')).toBe(1);
      expect(retry.stateTransitions.get('Wait For Missing Record Owner')).toBe(1);
      expect(retry.stateTransitions.get('Take Over Idempotency Record')).toBe(1);
      expect(work.byExecution.get(retry.arn)).toBe(1);
      expect(await records(sim)).toEqual([{ status: 'SUCCEEDED', owner: retry.arn, result: retry.output }]);
    });
  });

  test('an owner that has just started and is not known yet (DescribeExecution lags) is not taken over', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ duplicatePollInterval: Duration.seconds(5) });
    const work = new WorkTracker(() => 30);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const first = sim.startExecution(sm, { job: 'j' });
      // DescribeExecution is eventually consistent: the first time anyone asks about the first
      // execution, it does not know it yet.
      const describe = sim.describeExecution.bind(sim);
      let lagging = true;
      sim.describeExecution = (arn: string) => {
        if (arn === first.arn && lagging) {
          lagging = false;
          throw new ApiError('ExecutionDoesNotExist', `Execution Does Not Exist: '${arn}'`);
        }
        return describe(arn);
      };
      // The first's record written (waited for, not timed), so that the duplicate finds it.
      await until(async () => (await records(sim)).some((r) => r.owner === first.arn), "the first execution's record");
      const duplicate = sim.startExecution(sm, { job: 'j' });
      await Promise.all([first.done, duplicate.done]);

      expect(lagging).toBe(false);
      expect([first.status, duplicate.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
      expect(duplicate.stateTransitions.get('Note Missing Record Owner')).toBe(1);
      expect(duplicate.stateTransitions.has('Take Over Idempotency Record')).toBe(false);
      expect(duplicate.output).toEqual(first.output);
      expect(work.runs).toBe(1);
    });
  });
});

describe('limits', () => {
  test('an output too large to store fails with IdempotencyResultTooLarge and leaves the record FAILED', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack();
    let calls = 0;
    // About 100 KB of quotes: fine as an output (about 200 KB of JSON), too large once stored as a string.
    const bigOutput = async (input: any, _context: TaskContext) => (calls++ === 0 ? { quotes: '"'.repeat(100_000) } : { small: input.job });
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: bigOutput } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const tooLarge = await sim.startExecution(sm, { job: 'j' }).done;
      expect(tooLarge.status).toBe('FAILED');
      expect(tooLarge.error).toBe(IdempotentWorkflow.RESULT_TOO_LARGE_ERROR);
      expect((await records(sim)).map((r) => r.status)).toEqual(['FAILED']);

      const retry = await sim.startExecution(sm, { job: 'j' }).done;
      expect(retry.status).toBe('SUCCEEDED');
      expect(retry.output).toEqual({ small: 'j' });
    });
  });

  test('a repeat never holds its input and the stored result at once: each fits, together they would not', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack();
    let runs = 0;
    // 160 KB of input and 110 KB of result: each fits in 256 KiB of state data, the two together do not.
    const work = async (input: any) => {
      runs++;
      return { result: 'r'.repeat(110_000), of: input.job };
    };
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const input = { job: 'big', blob: 'i'.repeat(160_000) };
      const first = await sim.startExecution(sm, input).done;
      expect([first.status, first.error]).toEqual(['SUCCEEDED', undefined]);

      const repeat = await sim.startExecution(sm, input).done;
      expect([repeat.status, repeat.error]).toEqual(['SUCCEEDED', undefined]);
      expect(repeat.output).toEqual(first.output);
      expect(repeat.stateTransitions.get('Return Stored Result')).toBe(1);
      expect(runs).toBe(1);
    });
  });
});

describe('with a concurrency limit', () => {
  test('30 executions, 10 distinct inputs, limit 2: each body runs once, never more than 2 inside, no permit left', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ duplicatePollInterval: Duration.seconds(5) }, 2);
    const work = new WorkTracker(() => 10);
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const executions = Array.from({ length: 30 }, (_, i) => sim.startExecution(sm, { job: i % 10 }));
      await Promise.all(executions.map((e) => e.done));

      expect(statuses(executions)).toEqual({ SUCCEEDED: 30 });
      executions.forEach((e, i) => expect(e.output).toEqual({ worked: true, echo: { job: i % 10 } }));
      expect(work.runs).toBe(10);
      expect(work.maxInside).toBe(2);
      // Duplicates never took a permit: 10 acquisitions in all.
      const acquired = executions.filter((e) => e.stateTransitions.has('Run Protected Body'));
      expect(acquired).toHaveLength(10);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      expect((await records(sim)).every((r) => r.status === 'SUCCEEDED')).toBe(true);
    });
  });

  test('a failing body gives the permit back and marks the record FAILED; a stored result is returned without a permit', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({}, 1);
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const failed = await sim.startExecution(sm, { fail: true }).done;
      expect(failed.status).toBe('FAILED');
      expect(failed.error).toBe('WorkFailed');
      expect((await records(sim)).map((r) => r.status)).toEqual(['FAILED']);

      const first = await sim.startExecution(sm, { job: 1 }).done;
      // Key, claim, acquire, body, prepare the release, release, save; four of them DynamoDB calls.
      expect(overhead(first)).toBe(7);
      expect(first.dynamoCalls).toBe(4);
      const repeat = await sim.startExecution(sm, { job: 1 }).done;
      expect(repeat.output).toEqual(first.output);
      expect(repeat.stateTransitions.has('Acquire Permit')).toBe(false);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
    });
  });

  test('a limit read from the input is checked on the input, not on the record state', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({}, sfn.JsonPath.numberAt('$.limit'));
    const work = new WorkTracker();
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const invalid = await sim.startExecution(sm, { job: 1, limit: 0 }).done;
      expect([invalid.status, invalid.error]).toEqual(['FAILED', ConcurrencyControlledWorkflow.INVALID_LIMIT_ERROR]);
      // Checked before the claim: no record is left behind.
      expect(await records(sim)).toEqual([]);
      const valid = await sim.startExecution(sm, { job: 1, limit: 3 }).done;
      expect(valid.status).toBe('SUCCEEDED');
      expect(work.runs).toBe(1);
    });
  });

  test('with throttling and server errors after writes: still once per input, within the limit, nothing left held', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({ duplicatePollInterval: Duration.seconds(5) }, 2);
    const work = new WorkTracker(() => 5);
    const faults = { dynamoFaults: { throttleRate: 0.1, serverErrorAfterWriteRate: 0.1 }, seed: 7 };
    await simulate(stack, { ...faults, lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const executions = Array.from({ length: 40 }, (_, i) => sim.startExecution(sm, { job: i % 10 }));
      await Promise.all(executions.map((e) => e.done));

      expect(statuses(executions)).toEqual({ SUCCEEDED: 40 });
      executions.forEach((e, i) => expect(e.output).toEqual({ worked: true, echo: { job: i % 10 } }));
      expect(work.runs).toBe(10);
      expect(work.maxInside).toBeLessThanOrEqual(2);
      expect(await lockState(sim)).toEqual([{ lockName: 'TestStack/Workflow', permitsInUse: 0, holders: [] }]);
      expect((await records(sim)).map((r) => r.status)).toEqual(Array(10).fill('SUCCEEDED'));
      // The faults did hit the idempotency states.
      const retried = executions.filter((e) => (e.stateTransitions.get('Claim Idempotency Record') ?? 0) > 1 || (e.stateTransitions.get('Save Idempotent Result') ?? 0) > 1);
      expect(retried.length).toBeGreaterThan(0);
    });
  });

  test('an acquire timeout marks the record FAILED, so that a retry runs', async () => {
    const { stack, stateMachineId, workFunctionId } = idempotentStack({}, 1, { acquireTimeout: Duration.seconds(10) });
    const work = new WorkTracker((input) => (input.job === 'long' ? 60 : 1));
    await simulate(stack, { lambdaHandlers: { [workFunctionId]: work.handler } }, async (sim) => {
      const sm = sim.stateMachine(stateMachineId);
      const holder = sim.startExecution(sm, { job: 'long' });
      await inBody(holder);
      const timedOut = await sim.startExecution(sm, { job: 'short' }).done;
      expect([timedOut.status, timedOut.error]).toEqual(['FAILED', ConcurrencyControlledWorkflow.ACQUIRE_TIMEOUT_ERROR]);
      expect((await records(sim)).map((r) => r.status).sort()).toEqual(['FAILED', 'IN_PROGRESS']);
      await holder.done;
      const retry = await sim.startExecution(sm, { job: 'short' }).done;
      expect(retry.status).toBe('SUCCEEDED');
      expect(retry.stateTransitions.has('Take Over Idempotency Record')).toBe(false);
    });
  });
});
