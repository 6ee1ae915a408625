import { createHash } from 'crypto';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { CreateTableCommand, DescribeTableCommand, DynamoDBClient, GetItemCommand, PutItemCommand, TransactWriteItemsCommand, UpdateItemCommand } from '@aws-sdk/client-dynamodb';
import { DescribeExecutionCommand, GetExecutionHistoryCommand, ListExecutionsCommand, SFNClient, StopExecutionCommand } from '@aws-sdk/client-sfn';
import { App, Duration, Stack } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import * as tasks from 'aws-cdk-lib/aws-stepfunctions-tasks';
import { CodeDynamoDbEndpoint, DynamoTaskRunner, InsideTracker, jsonPath, LocalDynamoDb, LockMonitor, matchesFilterPattern, matchesPattern, metricFilterSums, REDRIVE_RESUME, refuseWhatItCannotRun, seededRandom, Simulator, targetInput, unsupportedPattern } from '../simulator';
import { logicalId, until, workflowStack } from './helpers';
import { executionHolderKeyOfArn, HOLDER_ACQUIRED_AT, LOCK_KEY, PERMITS_IN_USE, TICKET_KEY_SEPARATOR, ticketKey } from '../src/private/lock-schema';
import { holderKeyAt, ownHolderKey } from '../src/private/lock-tasks';

/*
 * The simulator is only worth what its fidelity is worth: these tests pin the AWS behaviour it
 * reproduces (EventBridge matching and input, error names, interpreter fixes, Lambda code with the SDK
 * pointed at the simulation, schedules, the Step Functions API).
 */

describe('EventBridge pattern matching', () => {
  const event = {
    'source': 'aws.states',
    'detail-type': 'Step Functions Execution Status Change',
    'resources': ['arn:aws:states:us-east-1:123456789012:execution:sm:one'],
    'detail': { status: 'ABORTED', stateMachineArn: 'arn:aws:states:us-east-1:123456789012:stateMachine:sm', attempts: 3, error: null },
  };

  test.each<[string, Record<string, unknown>, boolean]>([
    ['exact values in arrays', { 'source': ['aws.states'], 'detail-type': ['Step Functions Execution Status Change'] }, true],
    ['one of several values', { detail: { status: ['FAILED', 'TIMED_OUT', 'ABORTED'] } }, true],
    ['a value that differs', { detail: { status: ['SUCCEEDED'] } }, false],
    ['every field must match', { source: ['aws.states'], detail: { status: ['FAILED'] } }, false],
    ['an event array matches if any element does', { resources: ['arn:aws:states:us-east-1:123456789012:execution:sm:one'] }, true],
    ['prefix', { detail: { stateMachineArn: [{ prefix: 'arn:aws:states:us-east-1:' }] } }, true],
    ['prefix that differs', { detail: { stateMachineArn: [{ prefix: 'arn:aws:states:eu-west-1:' }] } }, false],
    ['suffix', { detail: { stateMachineArn: [{ suffix: ':sm' }] } }, true],
    ['anything-but a list', { detail: { status: [{ 'anything-but': ['SUCCEEDED', 'RUNNING'] }] } }, true],
    ['anything-but the value', { detail: { status: [{ 'anything-but': 'ABORTED' }] } }, false],
    ['anything-but a prefix', { detail: { status: [{ 'anything-but': { prefix: 'ABO' } }] } }, false],
    ['exists', { detail: { status: [{ exists: true }] } }, true],
    ['exists: false on a missing field', { detail: { redriveCount: [{ exists: false }] } }, true],
    ['exists: false on a present field', { detail: { status: [{ exists: false }] } }, false],
    ['null matches a null value', { detail: { error: [null] } }, true],
    ['numeric range', { detail: { attempts: [{ numeric: ['>', 0, '<=', 3] }] } }, true],
    ['numeric range that excludes', { detail: { attempts: [{ numeric: ['>', 3] }] } }, false],
    ['equals-ignore-case', { detail: { status: [{ 'equals-ignore-case': 'aborted' }] } }, true],
    ['a missing field never equals a value', { detail: { cause: ['x'] } }, false],
  ])('%s', (_name, pattern, expected) => {
    expect(matchesPattern(pattern, event)).toBe(expected);
  });

  test('rejects a pattern leaf that is not an array, as EventBridge does', () => {
    expect(() => matchesPattern({ source: 'aws.states' }, event)).toThrow(/must be in an array/);
  });
});

describe('CloudWatch Logs metric filters on an execution\'s log', () => {
  const line = {
    id: '7',
    type: 'ParallelStateEntered',
    details: { input: '{}', inputDetails: { truncated: false }, name: 'Wait For Permit' },
    previous_event_id: '6',
    event_timestamp: '1700000000000',
    execution_arn: 'arn:aws:states:us-east-1:123456789012:execution:sm:one',
  };

  test.each<[string, string, boolean]>([
    ['both conditions, as CDK writes them', '{ ($.type = "ParallelStateEntered") && ($.details.name = "Wait For Permit") }', true],
    ['one that differs', '{ ($.type = "ParallelStateEntered") && ($.details.name = "Run Protected Body") }', false],
    ['a missing field never equals', '{ $.details.error = "SemaphoreAcquireTimeout" }', false],
    ['!= on a missing field', '{ $.details.error != "SemaphoreAcquireTimeout" }', true],
    ['!= on the same text', '{ $.type != "ParallelStateEntered" }', false],
  ])('%s', (_name, pattern, expected) => {
    expect(matchesFilterPattern(pattern, line)).toBe(expected);
  });

  test.each(['ERROR', '{ $.type = "Parallel*" }', '{ $.count > 1 }', '{ ($.type = "A") || ($.type = "B") }'])('refuses a pattern it does not model: %s', (pattern) => {
    expect(() => matchesFilterPattern(pattern, line)).toThrow(/not modelled by the simulator/);
  });

  test('a filter counts the lines of the state machines that log to its log group at level ALL; other levels are refused', () => {
    const machine = (group: string, level = 'ALL') => ({
      Type: 'AWS::StepFunctions::StateMachine',
      Properties: { LoggingConfiguration: { Level: level, Destinations: [{ CloudWatchLogsLogGroup: { LogGroupArn: { 'Fn::GetAtt': [group, 'Arn'] } } }] } },
    });
    const filter = (group: string, name: string) => ({
      Type: 'AWS::Logs::MetricFilter',
      Properties: { LogGroupName: { Ref: group }, FilterPattern: '{ $.type = "ParallelStateEntered" }', MetricTransformations: [{ MetricName: name, MetricValue: '1' }] },
    });
    const template = { Resources: { A: machine('GroupA'), B: machine('GroupB'), FA: filter('GroupA', 'InA'), FB: filter('GroupB', 'InB') } };
    const execution = (stateMachine: string, entered: number) =>
      ({ arn: `arn:${stateMachine}`, stateMachine: { logicalId: stateMachine }, history: Array.from({ length: entered }, () => ({ type: 'ParallelStateEntered', name: 'P', timestamp: 0 })) }) as any;
    expect(metricFilterSums(template, [execution('A', 2), execution('B', 3), execution('A', 1)])).toEqual({ InA: 3, InB: 3 });
    expect(() => metricFilterSums({ Resources: { ...template.Resources, A: machine('GroupA', 'ERROR') } }, [execution('A', 1)])).toThrow(/level ERROR: the simulator models the log lines of level ALL only/);
  });
});

describe('EventBridge target input', () => {
  const event = { 'detail-type': 'X', 'detail': { executionArn: 'arn:1', input: '{"a":1}', count: 2, tags: ['t'] } };

  test('the whole event by default', () => {
    expect(targetInput({}, event)).toBe(event);
  });

  test('a constant Input', () => {
    expect(targetInput({ Input: '{"fixed":true}' }, event)).toEqual({ fixed: true });
  });

  test('InputPath', () => {
    expect(targetInput({ InputPath: '$.detail' }, event)).toEqual(event.detail);
    expect(jsonPath(event, '$.detail.tags[0]')).toBe('t');
  });

  test('InputTransformer: strings go in as characters, other values as JSON', () => {
    expect(
      targetInput(
        {
          InputTransformer: {
            InputPathsMap: { arn: '$.detail.executionArn', input: '$.detail.input', count: '$.detail.count' },
            InputTemplate: '{"execution": "<arn>", "raw": "<input>", "n": <count>}',
          },
        },
        event,
      ),
    ).toEqual({ execution: 'arn:1', raw: '{"a":1}', n: 2 });
  });
});

/** A stack whose one state machine is `definition`, and a table. */
function machineStack(build: (stack: Stack, table: dynamodb.Table) => sfn.IChainable) {
  const stack = new Stack(new App(), 'Sim');
  const table = new dynamodb.Table(stack, 'Table', { partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING } });
  const sm = new sfn.StateMachine(stack, 'Machine', { definitionBody: sfn.DefinitionBody.fromChainable(build(stack, table)) });
  return { stack, sm, table };
}

/** A task handler that records its inputs and fails the first time it runs. */
function failsFirstRun(inputs: unknown[]) {
  return (input: unknown) => {
    inputs.push(input);
    if (inputs.length === 1) throw Object.assign(new Error('first run'), { name: 'FirstRun' });
    return 'ok';
  };
}

/** Start an execution, expect it to fail, and redrive it: the redriven run, once it ended. */
async function failThenRedrive(sim: Simulator, sm: sfn.StateMachine, input: unknown) {
  const first = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)), input).done;
  expect(first.status).toBe('FAILED');
  return sim.redriveExecution(first.arn);
}

describe('state machines', () => {
  test('DynamoDB errors carry the names Step Functions gives them, for both integrations', async () => {
    const { stack, sm } = machineStack((s, table) => {
      const conditional = new tasks.DynamoPutItem(s, 'Conditional Put', {
        table,
        item: { pk: tasks.DynamoAttributeValue.fromString('k') },
        conditionExpression: 'attribute_exists(pk)',
        resultPath: sfn.JsonPath.DISCARD,
      });
      const invalid = new tasks.DynamoUpdateItem(s, 'Invalid Update', {
        table,
        key: { pk: tasks.DynamoAttributeValue.fromString('k') },
        updateExpression: 'SET absentCounter = absentCounter + :one',
        expressionAttributeValues: { ':one': tasks.DynamoAttributeValue.fromNumber(1) },
        resultPath: sfn.JsonPath.DISCARD,
      });
      const sdk = new tasks.CallAwsService(s, 'Sdk Conditional Put', {
        service: 'dynamodb',
        action: 'putItem',
        parameters: { TableName: table.tableName, Item: { pk: { S: 'k' } }, ConditionExpression: 'attribute_exists(pk)' },
        iamResources: [table.tableArn],
        resultPath: sfn.JsonPath.DISCARD,
      });
      const record = (name: string) => ({ resultPath: `$.${name}` });
      conditional.addCatch(invalid, { errors: ['DynamoDB.ConditionalCheckFailedException'], ...record('first') });
      invalid.addCatch(sdk, { errors: ['DynamoDB.AmazonDynamoDBException'], ...record('second') });
      sdk.addCatch(new sfn.Succeed(s, 'Done'), { errors: ['DynamoDb.ConditionalCheckFailedException'], ...record('third') });
      return conditional;
    });
    const sim = await Simulator.start(stack);
    try {
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any))).done;

      expect(e.status).toBe('SUCCEEDED');
      expect(e.output).toMatchObject({
        first: { Error: 'DynamoDB.ConditionalCheckFailedException' },
        second: { Error: 'DynamoDB.AmazonDynamoDBException', Cause: expect.stringMatching(/attribute that does not exist/) },
        third: { Error: 'DynamoDb.ConditionalCheckFailedException' },
      });
      expect(e.dynamoCalls).toBe(3);
    } finally {
      await sim.stop();
    }
  });

  test.each<[string, Record<string, unknown>, string | undefined, RegExp]>([
    ['JSONata', { QueryLanguage: 'JSONata', Type: 'Pass' }, undefined, /state 'S': it uses JSONata, and the simulator interprets JSONPath only/],
    ['PartiQL', { Type: 'Task', Resource: 'arn:aws:states:::aws-sdk:dynamodb:executeTransaction', Parameters: {} }, undefined, /state 'S': DynamoDB executeTransaction \(PartiQL\)/],
    [
      'ReturnValuesOnConditionCheckFailure',
      { Type: 'Task', Resource: 'arn:aws:states:::dynamodb:updateItem', Parameters: { ReturnValuesOnConditionCheckFailure: 'ALL_OLD' } },
      undefined,
      /state 'S': ReturnValuesOnConditionCheckFailure: dynalite, the simulator's DynamoDB, would ignore it/,
    ],
    ['the optimized DynamoDB integration with a callback', { Type: 'Task', Resource: 'arn:aws:states:::dynamodb:putItem.waitForTaskToken' }, undefined, /supports Request Response only, not .waitForTaskToken/],
    ['an AWS SDK integration that runs a job', { Type: 'Task', Resource: 'arn:aws:states:::aws-sdk:batch:submitJob.sync' }, undefined, /the AWS SDK integration batch:submitJob supports Request Response and .waitForTaskToken only, not .sync/],
    ['Lambda that runs a job', { Type: 'Task', Resource: 'arn:aws:states:::lambda:invoke.sync' }, undefined, /the optimized lambda integration supports Request Response and .waitForTaskToken only, not .sync/],
    ['SQS that runs a job', { Type: 'Task', Resource: 'arn:aws:states:::sqs:sendMessage.sync' }, undefined, /optimized sqs integration supports Request Response and .waitForTaskToken only/],
    ['AWS Batch with a callback', { Type: 'Task', Resource: 'arn:aws:states:::batch:submitJob.waitForTaskToken' }, undefined, /optimized batch integration supports Request Response and .sync only, not .waitForTaskToken/],
    ['an HTTP Task with a callback', { Type: 'Task', Resource: 'arn:aws:states:::http:invoke.waitForTaskToken' }, undefined, /optimized http integration supports Request Response only/],
    ['.sync:2 beside Step Functions', { Type: 'Task', Resource: 'arn:aws:states:::glue:startJobRun.sync:2' }, undefined, /has no .sync:2/],
    ['a callback in Express', { Type: 'Task', Resource: 'arn:aws:states:::sqs:sendMessage.waitForTaskToken' }, 'EXPRESS', /an Express state machine supports neither/],
    [
      'a Distributed Map',
      { Type: 'Map', ItemProcessor: { ProcessorConfig: { Mode: 'DISTRIBUTED', ExecutionType: 'STANDARD' }, StartAt: 'I', States: { I: { Type: 'Pass', End: true } } } },
      undefined,
      /state 'S': a Distributed Map \(child executions, ItemReader, ResultWriter\): the simulator runs inline Map states only/,
    ],
    [
      'an eventually consistent read, with stale reads on',
      { Type: 'Task', Resource: 'arn:aws:states:::dynamodb:getItem', Parameters: { TableName: 't', Key: {} } },
      'STALE',
      /state 'S': an eventually consistent DynamoDB getItem: with staleReads on/,
    ],
  ])('refuses to run what it cannot run, or AWS refuses, naming the state: %s', (_, state, type, message) => {
    const definition = { StartAt: 'Start', States: { Start: { Type: 'Parallel', Branches: [{ StartAt: 'S', States: { S: { ...state, End: true } } }], End: true } } };
    expect(() => refuseWhatItCannotRun('Machine', definition, type, type === 'STALE')).toThrow(message);
    expect(() => refuseWhatItCannotRun('Machine', { StartAt: 'S', States: { S: { Type: 'Pass', End: true } } }, type)).not.toThrow();
  });

  test('accepts the integration patterns AWS supports (per its table of integrations)', () => {
    const accepted = [
      'arn:aws:states:::dynamodb:updateItem',
      'arn:aws:states:::aws-sdk:dynamodb:updateItem.waitForTaskToken',
      'arn:aws:states:::aws-sdk:sfn:sendTaskSuccess',
      'arn:aws:states:::lambda:invoke.waitForTaskToken',
      'arn:aws:states:::sqs:sendMessage.waitForTaskToken',
      'arn:aws:states:::states:startExecution.sync:2',
      'arn:aws:states:::states:startExecution.waitForTaskToken',
      'arn:aws:states:::ecs:runTask.sync',
      'arn:aws:states:::ecs:runTask.waitForTaskToken',
      'arn:aws:states:::glue:startJobRun.sync',
      'arn:aws:states:::http:invoke',
      'arn:aws:lambda:us-east-1:123456789012:function:f',
    ];
    expect(accepted.filter((r) => unsupportedPattern(r) !== undefined)).toEqual([]);
    const definition = { StartAt: 'S', States: { S: { Type: 'Task', Resource: 'arn:aws:states:::ecs:runTask.sync', End: true } } };
    expect(() => refuseWhatItCannotRun('Machine', definition)).not.toThrow();
  });

  test('StartExecution with the name of a running execution: the same input returns it; other input, or a closed one, ExecutionAlreadyExists; ListExecutions newest first', async () => {
    const { stack, sm } = machineStack((s) => new sfn.Wait(s, 'Pause', { time: sfn.WaitTime.duration(Duration.seconds(10)) }));
    const sim = await Simulator.start(stack);
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const first = sim.startExecution(machine, { a: 1 }, { name: 'job' });
      expect(sim.startExecution(machine, { a: 1 }, { name: 'job' })).toBe(first);
      expect(() => sim.startExecution(machine, { a: 2 }, { name: 'job' })).toThrow(expect.objectContaining({ name: 'ExecutionAlreadyExists' }));
      await first.done;
      expect(() => sim.startExecution(machine, { a: 1 }, { name: 'job' })).toThrow(expect.objectContaining({ name: 'ExecutionAlreadyExists' }));
      // ListExecutions: the most recent first, with the stop date of those that ended.
      const second = sim.startExecution(machine, {}, { name: 'later' });
      const listed = sim.listExecutions(machine.arn);
      expect(listed.map((x) => [x.name, x.status, x.stopDate !== undefined])).toEqual([['later', 'RUNNING', false], ['job', 'SUCCEEDED', true]]);
      // PENDING_REDRIVE belongs to a Distributed Map's child executions: refused for a state machine.
      expect(() => sim.listExecutions(machine.arn, 'PENDING_REDRIVE')).toThrow(expect.objectContaining({ name: 'ValidationException' }));
      second.abort();
    } finally {
      await sim.stop();
    }
  });

  test('Express: fails with States.Timeout after five minutes, emits no status event, cannot be described or redriven', async () => {
    const stack = new Stack(new App(), 'Express');
    const sm = new sfn.StateMachine(stack, 'Machine', {
      stateMachineType: sfn.StateMachineType.EXPRESS,
      definitionBody: sfn.DefinitionBody.fromChainable(new sfn.Wait(stack, 'Long', { time: sfn.WaitTime.duration(Duration.minutes(10)) })),
    });
    const sim = await Simulator.start(stack);
    try {
      const started = sim.now();
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any))).done;
      expect([e.status, e.error]).toEqual(['TIMED_OUT', 'States.Timeout']);
      // Five simulated minutes from its start: it stops at its deadline, however late the scaled
      // timer fired on a loaded machine (its history's last event says the same).
      expect(e.startDate).toBeGreaterThanOrEqual(started);
      expect((e.stopDate! - e.startDate) / 1000).toBeGreaterThanOrEqual(299);
      expect((e.stopDate! - e.startDate) / 1000).toBeLessThan(330);
      expect(e.history[e.history.length - 1]).toEqual(expect.objectContaining({ type: 'ExecutionTimedOut', timestamp: e.stopDate }));
      expect(sim.events).toEqual([]);
      expect(() => sim.describeExecution(e.arn)).toThrow(expect.objectContaining({ name: 'InvalidArn' }));
      expect(() => sim.redriveExecution(e.arn)).toThrow(expect.objectContaining({ name: 'ExecutionNotRedrivable' }));
    } finally {
      await sim.stop();
    }
  });

  test('staleReads: DescribeExecution and ListExecutions answer as of a moment ago: not found after a start, the previous status after a change', async () => {
    const { stack, sm } = machineStack((s) => new sfn.Wait(s, 'Pause', { time: sfn.WaitTime.duration(Duration.seconds(300)) }));
    const sim = await Simulator.start(stack, { staleReads: { windowSeconds: 60, rate: 1 } });
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const e = sim.startExecution(machine);
      const look = () => {
        try {
          return sim.describeExecutionAsSeen(e.arn).status;
        } catch (err) {
          return (err as Error).name;
        }
      };
      // Started half a window ago: some answers do not know it yet, the others see it RUNNING.
      await sim.sleep(30);
      expect(new Set(Array.from({ length: 40 }, look))).toEqual(new Set(['ExecutionDoesNotExist', 'RUNNING']));
      await e.done;
      // Ended half a window ago: RUNNING or SUCCEEDED, never a status it did not have; the current answer is SUCCEEDED.
      await sim.sleep(30);
      expect(new Set(Array.from({ length: 40 }, look))).toEqual(new Set(['RUNNING', 'SUCCEEDED']));
      expect(sim.describeExecution(e.arn).status).toBe('SUCCEEDED');
      // Past the window, every answer is current.
      await sim.sleep(31);
      expect(new Set(Array.from({ length: 10 }, look))).toEqual(new Set(['SUCCEEDED']));
      expect(sim.describeExecutionAsSeen(e.arn)).toMatchObject({ status: 'SUCCEEDED', stopDate: e.stopDate! / 1000 });
      expect(sim.listExecutionsAsSeen(machine.arn, 'SUCCEEDED').map((x) => x.name)).toEqual([e.name]);
    } finally {
      await sim.stop();
    }
  });

  test('sleep ends at once on a signal that aborts, and on one that had aborted before it was called (a stopped execution\'s handler)', async () => {
    const { stack } = machineStack((s) => new sfn.Pass(s, 'Nothing'));
    const sim = await Simulator.start(stack);
    try {
      const before = new AbortController();
      before.abort();
      const during = new AbortController();
      const started = sim.now();
      setTimeout(() => during.abort(), 50);
      await Promise.all([sim.sleep(3_600, before.signal), sim.sleep(3_600, during.signal)]);
      // An hour of simulated time not slept: a few seconds at most pass (the second sleep's 50 ms of real time).
      expect(sim.now() - started).toBeLessThan(600_000);
      // Without a signal, or with one that does not abort, it sleeps its time.
      const later = sim.now();
      await sim.sleep(30, new AbortController().signal);
      // (Node's timers and Date.now() can disagree by a millisecond: 0.1 s at the default scale.)
      expect(sim.now() - later).toBeGreaterThanOrEqual(29_000);
    } finally {
      await sim.stop();
    }
  });

  test('a sleep still pending when the simulator stops never ends, and leaves no timer to keep the process alive', async () => {
    const { stack } = machineStack((s) => new sfn.Pass(s, 'Nothing'));
    const sim = await Simulator.start(stack); // 20 simulated seconds are 0.2 s of real time
    const ended: string[] = [];
    const signal = new AbortController();
    void sim.sleep(20).then(() => ended.push('without a signal'));
    void sim.sleep(20, signal.signal).then(() => ended.push('with a signal'));
    const timeouts = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    const before = timeouts();
    await sim.stop();
    expect(timeouts()).toBeLessThanOrEqual(before - 2);
    // Neither the signal aborting after the stop nor a sleep begun after it ends anything.
    signal.abort();
    void sim.sleep(1).then(() => ended.push('after the stop'));
    await new Promise((r) => setTimeout(r, 500));
    expect(ended).toEqual([]);
  });

  test('a task still pending when the simulator stops leaves none of the interpreter\'s timers behind', async () => {
    const stack = new Stack(new App(), 'Sim');
    const hang = new sfn.CustomState(stack, 'Hang', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::hang' } });
    // The execution's timeout and the task's (99999999 s by default, as on AWS) are both timers of the interpreter.
    const sm = new sfn.StateMachine(stack, 'Machine', { definitionBody: sfn.DefinitionBody.fromChainable(hang), timeout: Duration.hours(1) });
    let entered!: () => void;
    const inTask = new Promise<void>((resolve) => (entered = resolve));
    const sim = await Simulator.start(stack, {
      taskHandlers: {
        Hang: () => {
          entered();
          return new Promise(() => undefined); // never settles
        },
      },
    });
    const execution = sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)));
    void execution.done.catch(() => undefined);
    await inTask;
    const timeouts = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    const before = timeouts();
    await sim.stop();
    expect(timeouts()).toBeLessThanOrEqual(before - 2);
  });

  test('counts retries as billed transitions', async () => {
    let calls = 0;
    const { stack, sm } = machineStack((s) => {
      const flaky = new sfn.CustomState(s, 'Flaky', {
        stateJson: {
          Type: 'Task',
          Resource: 'arn:aws:states:::flaky',
          ResultPath: '$.flaky',
          Retry: [{ ErrorEquals: ['Flaky'], IntervalSeconds: 1, MaxAttempts: 3 }],
        },
      });
      return flaky.next(new sfn.Pass(s, 'After'));
    });
    const flakyHandler = () => {
      if (++calls < 3) throw Object.assign(new Error('not yet'), { name: 'Flaky' });
      return 'ok';
    };
    const sim = await Simulator.start(stack, { taskHandlers: { Flaky: flakyHandler } });
    try {
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any))).done;

      expect(e.output).toEqual({ flaky: 'ok' });
      expect(e.stateTransitions.get('Flaky')).toBe(3); // entered once, retried twice
      expect(e.transitions).toBe(4);
      // Started; the task entered, scheduled, started, failed, scheduled and started twice more, succeeded,
      // exited; the Pass entered and exited; the execution succeeded.
      expect(e.historyEvents).toBe(1 + (4 + 3 + 3 + 1) + 2 + 1);
      // GetExecutionHistory gives those events, typed as Step Functions types them.
      expect(sim.getExecutionHistory(e.arn, false).map((h) => h.type)).toEqual([
        'ExecutionStarted',
        'TaskStateEntered',
        'TaskScheduled',
        'TaskStarted',
        'TaskFailed',
        'TaskScheduled',
        'TaskStarted',
        'TaskFailed',
        'TaskScheduled',
        'TaskStarted',
        'TaskSucceeded',
        'TaskStateExited',
        'PassStateEntered',
        'PassStateExited',
        'ExecutionSucceeded',
      ]);
      // With the details of the execution's start and end, and of each state entered and exited.
      const history = sim.getExecutionHistory(e.arn, false);
      expect(history[0].executionStartedEventDetails).toEqual({ input: '{}', inputDetails: { truncated: false } });
      expect(history.find((h) => h.type === 'PassStateEntered')!.stateEnteredEventDetails).toEqual({
        name: 'After',
        input: JSON.stringify({ flaky: 'ok' }),
        inputDetails: { truncated: false },
      });
      expect(history.find((h) => h.type === 'TaskStateExited')!.stateExitedEventDetails).toEqual({
        name: 'Flaky',
        output: JSON.stringify({ flaky: 'ok' }),
        outputDetails: { truncated: false },
      });
      expect(history[history.length - 1].executionSucceededEventDetails).toEqual({ output: JSON.stringify({ flaky: 'ok' }), outputDetails: { truncated: false } });
    } finally {
      await sim.stop();
    }
  });

  test('GetExecutionHistory: a task\'s own events carry its resource, parameters, result or error; a function ARN task logs LambdaFunction… events', async () => {
    const { stack, sm } = machineStack((s, t) => {
      const fn = new lambda.Function(s, 'Echo', {
        runtime: lambda.Runtime.NODEJS_22_X,
        handler: 'index.handler',
        code: lambda.Code.fromInline('exports.handler = async (e) => { if (e.fail) { const x = new Error(\'asked to\'); x.name = \'Asked\'; throw x; } return { echoed: e.n }; };'),
      });
      const put = new tasks.DynamoPutItem(s, 'Put', {
        table: t,
        item: { pk: tasks.DynamoAttributeValue.fromString(sfn.JsonPath.stringAt('$.key')) },
        resultPath: sfn.JsonPath.DISCARD,
      });
      const legacy = new tasks.LambdaInvoke(s, 'Echo Legacy', { lambdaFunction: fn, payloadResponseOnly: true, resultPath: '$.legacy' });
      const invoke = new tasks.LambdaInvoke(s, 'Echo Invoke', { lambdaFunction: fn, resultSelector: { 'echoed.$': '$.Payload.echoed' }, resultPath: '$.invoked' });
      return put.next(legacy).next(invoke);
    });
    const sim = await Simulator.start(stack);
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const ok = await sim.startExecution(machine, { key: 'a', n: 7 }).done;
      expect(ok.status).toBe('SUCCEEDED');
      const history = sim.getExecutionHistory(ok.arn, false);
      const of = (type: string) => history.filter((h) => h.type === type);
      expect(of('TaskScheduled').map((h) => h.taskScheduledEventDetails)).toEqual([
        { resourceType: 'dynamodb', resource: 'putItem', region: 'us-east-1', parameters: expect.stringContaining('"Item":{"pk":{"S":"a"}}') },
        { resourceType: 'lambda', resource: 'invoke', region: 'us-east-1', parameters: expect.stringContaining('"Payload":{"key":"a","n":7,"legacy":{"echoed":7}}') },
      ]);
      expect(of('TaskStarted').map((h) => h.taskStartedEventDetails)).toEqual([
        { resourceType: 'dynamodb', resource: 'putItem' },
        { resourceType: 'lambda', resource: 'invoke' },
      ]);
      expect(JSON.parse((of('TaskSucceeded')[1].taskSucceededEventDetails as any).output)).toMatchObject({ Payload: { echoed: 7 }, StatusCode: 200 });
      // The legacy integration (the function's ARN as the resource).
      expect(of('LambdaFunctionScheduled').map((h) => h.lambdaFunctionScheduledEventDetails)).toEqual([
        { resource: expect.stringMatching(/^arn:aws:lambda:.*:function:/), input: JSON.stringify({ key: 'a', n: 7 }), inputDetails: { truncated: false } },
      ]);
      expect(of('LambdaFunctionStarted')).toHaveLength(1);
      expect(of('LambdaFunctionSucceeded').map((h) => h.lambdaFunctionSucceededEventDetails)).toEqual([{ output: JSON.stringify({ echoed: 7 }), outputDetails: { truncated: false } }]);

      // A failure: its error and cause.
      const failed = await sim.startExecution(machine, { key: 'b', n: 1, fail: true }).done;
      expect([failed.status, failed.error]).toEqual(['FAILED', 'Asked']);
      const failure = sim.getExecutionHistory(failed.arn, false).find((h) => h.type === 'LambdaFunctionFailed')!;
      expect(failure.lambdaFunctionFailedEventDetails).toEqual({ error: 'Asked', cause: expect.stringContaining('asked to') });

      // Through the API, without execution data: no inputs, outputs or parameters.
      const client = new SFNClient({ endpoint: sim.sfnApi!.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'a', secretAccessKey: 'b' } });
      const page = await client.send(new GetExecutionHistoryCommand({ executionArn: ok.arn, includeExecutionData: false }));
      client.destroy();
      expect(page.events!.find((h) => h.type === 'TaskScheduled')!.taskScheduledEventDetails).toEqual({ resourceType: 'dynamodb', resource: 'putItem', region: 'us-east-1' });
      expect(page.events!.find((h) => h.type === 'TaskStateEntered')!.stateEnteredEventDetails).toEqual({ name: 'Put' });
    } finally {
      await sim.stop();
    }
  });

  test('history: the 25,000th event may only be the execution\'s success; past it the execution fails with States.Runtime and cannot be redriven', async () => {
    // Count ⇄ Done?: four events per round, beside ExecutionStarted, the Succeed state's two and ExecutionSucceeded.
    const { stack, sm } = machineStack((s) => {
      const count = new sfn.Pass(s, 'Count', { parameters: { 'n.$': 'States.MathAdd($.n, 1)', 'rounds.$': '$.rounds' } });
      return count.next(new sfn.Choice(s, 'Done?').when(sfn.Condition.numberLessThanJsonPath('$.n', '$.rounds'), count).otherwise(new sfn.Succeed(s, 'Done')));
    });
    const sim = await Simulator.start(stack, { timeScale: 0.001 });
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const small = await sim.startExecution(machine, { n: 0, rounds: 1 }).done;
      expect([small.status, small.historyEvents]).toEqual(['SUCCEEDED', 8]);
      const exact = await sim.startExecution(machine, { n: 0, rounds: 6249 }).done;
      expect([exact.status, exact.historyEvents]).toEqual(['SUCCEEDED', 25_000]);

      const over = await sim.startExecution(machine, { n: 0, rounds: 6250 }).done;
      expect([over.status, over.error, over.cause]).toEqual(['FAILED', 'States.Runtime', 'The execution reached the maximum number of history events (25000).']);
      expect(over.historyEvents).toBe(25_000);
      expect(() => sim.redriveExecution(over.arn)).toThrow('Execution history event limit exceeded');
    } finally {
      await sim.stop();
    }
  });

  test('$$.Execution.Input is the execution\'s input inside a Parallel branch whose input is its Parameters, and in a redriven run', async () => {
    const seen: unknown[] = [];
    const { stack, sm } = machineStack((s) => {
      const read = new sfn.CustomState(s, 'Read Input', {
        stateJson: {
          Type: 'Task',
          Resource: 'arn:aws:states:::readInput',
          Parameters: { 'input.$': '$$.Execution.Input', 'own.$': '$', 'execution.$': '$$.Execution' },
          ResultPath: null,
        },
      });
      const branch = new sfn.Parallel(s, 'Branch', { resultPath: sfn.JsonPath.DISCARD, parameters: { inside: true } } as sfn.ParallelProps).branch(read);
      return branch;
    });
    const sim = await Simulator.start(stack, { taskHandlers: { 'Read Input': failsFirstRun(seen) } });
    try {
      const again = await failThenRedrive(sim, sm, { job: 'a' });

      expect(again.status).toBe('SUCCEEDED');
      expect(seen.map((x: any) => ({ input: x.input, own: x.own }))).toEqual([
        { input: { job: 'a' }, own: { inside: true } },
        { input: { job: 'a' }, own: { inside: true } },
      ]);
      // $$.Execution.RedriveTime: none before the redrive, the redrive's time after it.
      const [first, second] = seen as any[];
      expect([first.execution.RedriveTime, second.execution.RedriveCount]).toEqual([undefined, 1]);
      expect(Date.parse(second.execution.RedriveTime)).toBe(again.redriveDate);
    } finally {
      await sim.stop();
    }
  });

  test('$$.State: Name, EnteredTime fixed for one entry of a state (retries included), RetryCount', async () => {
    const seen: any[] = [];
    let failures = 2;
    const { stack, sm } = machineStack((s) => {
      const flaky = new sfn.CustomState(s, 'Flaky', {
        stateJson: {
          Type: 'Task',
          Resource: 'arn:aws:states:::flaky',
          Parameters: { 'name.$': '$$.State.Name', 'entered.$': '$$.State.EnteredTime', 'retry.$': '$$.State.RetryCount' },
          Retry: [{ ErrorEquals: ['Flaky'], IntervalSeconds: 3, MaxAttempts: 2 }],
          ResultPath: '$.flaky',
        },
      });
      const read = new sfn.Pass(s, 'Read', {
        parameters: { 'name.$': '$$.State.Name', 'entered.$': '$$.State.EnteredTime', 'again.$': '$$.State.EnteredTime', 'redrive.$': '$$.Execution' },
      });
      return new sfn.Wait(s, 'Pause', { time: sfn.WaitTime.duration(Duration.seconds(5)) }).next(flaky).next(read);
    });
    const handler = async (input: any) => {
      seen.push(input);
      if (failures-- > 0) throw Object.assign(new Error('not yet'), { name: 'Flaky' });
      return 'ok';
    };
    const sim = await Simulator.start(stack, { taskHandlers: { Flaky: handler } });
    try {
      const started = sim.now();
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any))).done;
      expect(e.status).toBe('SUCCEEDED');
      expect(seen.map((x) => [x.name, x.retry])).toEqual([['Flaky', 0], ['Flaky', 1], ['Flaky', 2]]);
      // One entry of the task: the same EnteredTime for each attempt, after the 5 s pause.
      expect(new Set(seen.map((x) => x.entered)).size).toBe(1);
      expect(Date.parse(seen[0].entered) - started).toBeGreaterThanOrEqual(5000);
      const out = e.output as any;
      expect([out.name, out.entered === out.again, Date.parse(out.entered) > Date.parse(seen[0].entered)]).toEqual(['Read', true, true]);
      expect(out.redrive.RedriveTime).toBeUndefined();
    } finally {
      await sim.stop();
    }
  });

  test('onStateEntered and the history give the time a state was entered ($$.State.EnteredTime), however late the simulator reads the event', async () => {
    // A handler that keeps the process busy for 100 ms (10 s simulated) right after its state was
    // entered: the simulator reads that entry afterwards, as it does on a loaded machine (the scenarios
    // measured up to 12 s simulated late), and must not date it then.
    const { stack, sm } = machineStack((s) => new sfn.CustomState(s, 'Busy', {
      stateJson: { Type: 'Task', Resource: 'arn:aws:states:::busy', Parameters: { 'entered.$': '$$.State.EnteredTime' } },
    }));
    const inputs: Array<{ entered: string }> = [];
    const busy = (input: { entered: string }) => {
      inputs.push(input);
      const end = Date.now() + 100;
      while (Date.now() < end);
      return 'ok';
    };
    const sim = await Simulator.start(stack, { taskHandlers: { Busy: busy }, timeScale: 0.01 });
    const seen: Array<{ enteredAt: number; readAt: number }> = [];
    sim.onStateEntered((_, stateName, enteredAt) => {
      if (stateName === 'Busy') seen.push({ enteredAt, readAt: sim.now() });
    });
    try {
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any))).done;
      expect(e.status).toBe('SUCCEEDED');
      expect(seen).toHaveLength(1);
      const [{ enteredAt, readAt }] = seen;
      // The event was read seconds (simulated) after the state was entered...
      expect(readAt - enteredAt).toBeGreaterThanOrEqual(5_000);
      // ...and the listener's time and the history's are the state's EnteredTime, taken a moment before
      // the event (the same real millisecond unless the process paused between them: 10 ms real allowed).
      expect(Math.abs(enteredAt - Date.parse(inputs[0].entered))).toBeLessThanOrEqual(1_000);
      expect(e.history.find((h) => h.type === 'TaskStateEntered')!.timestamp).toBe(enteredAt);
    } finally {
      await sim.stop();
    }
  });

  test('a redrive re-runs only the unsuccessful branches of a Parallel: one that ended keeps its output, an aborted one resumes where it stopped', async () => {
    const failInputs: unknown[] = [];
    let doneRuns = 0;
    const { stack, sm } = machineStack((s) => {
      const done = new sfn.CustomState(s, 'Done Branch', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::done', ResultPath: '$.done' } });
      const beforeFailing = new sfn.Wait(s, 'Wait Before Failing', { time: sfn.WaitTime.duration(Duration.seconds(2)) });
      const failOnce = new sfn.CustomState(s, 'Fail Once', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::failOnce', ResultPath: '$.failed' } });
      const beforeWait = new sfn.Pass(s, 'Before Wait', { result: sfn.Result.fromNumber(1), resultPath: '$.before' });
      const longWait = new sfn.Wait(s, 'Long Wait', { time: sfn.WaitTime.duration(Duration.seconds(30)) });
      return new sfn.Parallel(s, 'Fork').branch(done).branch(beforeFailing.next(failOnce)).branch(beforeWait.next(longWait));
    });
    const sim = await Simulator.start(stack, {
      taskHandlers: { 'Done Branch': () => `run ${++doneRuns}`, 'Fail Once': failsFirstRun(failInputs) },
    });
    try {
      const again = await failThenRedrive(sim, sm, { job: 'b' });

      expect(again.status).toBe('SUCCEEDED');
      // The branch that ended is not run again: its recorded output stands in the Parallel's result.
      expect(doneRuns).toBe(1);
      expect(again.output).toEqual([
        { job: 'b', done: 'run 1' },
        { job: 'b', failed: 'ok' },
        { job: 'b', before: 1 },
      ]);
      // The failed branch resumes at its failed state, the aborted one at the state it was in.
      expect(Object.fromEntries(again.stateTransitions)).toEqual({
        'Fork': 2,
        'Done Branch': 1,
        'Wait Before Failing': 1,
        'Fail Once': 2,
        'Before Wait': 1,
        'Long Wait': 2,
      });
      expect(failInputs).toEqual([{ job: 'b' }, { job: 'b' }]);
    } finally {
      await sim.stop();
    }
  });

  test('a second redrive still skips the branch the first one skipped', async () => {
    let failRuns = 0;
    let doneRuns = 0;
    const { stack, sm } = machineStack((s) => {
      const done = new sfn.CustomState(s, 'Done Branch', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::done', ResultPath: '$.done' } });
      const beforeFailing = new sfn.Wait(s, 'Wait Before Failing', { time: sfn.WaitTime.duration(Duration.seconds(2)) });
      const failTwice = new sfn.CustomState(s, 'Fail Twice', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::failTwice', ResultPath: '$.failed' } });
      return new sfn.Parallel(s, 'Fork').branch(done).branch(beforeFailing.next(failTwice));
    });
    const sim = await Simulator.start(stack, {
      taskHandlers: {
        'Done Branch': () => `run ${++doneRuns}`,
        'Fail Twice': () => {
          if (++failRuns <= 2) throw Object.assign(new Error(`run ${failRuns}`), { name: 'NotYet' });
          return 'ok';
        },
      },
    });
    try {
      const once = await failThenRedrive(sim, sm, { job: 'c' });
      expect(once.status).toBe('FAILED');
      const twice = await sim.redriveExecution(once.arn);

      expect(twice.status).toBe('SUCCEEDED');
      expect(twice.redriveCount).toBe(2);
      expect(doneRuns).toBe(1);
      expect(twice.output).toEqual([{ job: 'c', done: 'run 1' }, { job: 'c', failed: 'ok' }]);
      expect(Object.fromEntries(twice.stateTransitions)).toEqual({ 'Fork': 3, 'Done Branch': 1, 'Wait Before Failing': 1, 'Fail Twice': 3 });
      // Each run's end is in the history with its own details.
      const ends = sim.getExecutionHistory(twice.arn, false).filter((h) => String(h.type).match(/^Execution(Failed|Redriven|Succeeded)$/));
      const detail = (h: Record<string, any>) => h.executionFailedEventDetails?.error ?? h.executionRedrivenEventDetails?.redriveCount ?? null;
      expect(ends.map((h) => [h.type, detail(h)])).toEqual([
        ['ExecutionFailed', 'NotYet'],
        ['ExecutionRedriven', 1],
        ['ExecutionFailed', 'NotYet'],
        ['ExecutionRedriven', 2],
        ['ExecutionSucceeded', null],
      ]);
    } finally {
      await sim.stop();
    }
  });

  test('a redrive inside a Parallel branch runs the unsuccessful state again with its own input, as AWS does', async () => {
    const inputs: unknown[] = [];
    const { stack, sm } = machineStack((s) => {
      const mark = new sfn.Pass(s, 'Mark', { result: sfn.Result.fromObject({ ticket: 7 }), resultPath: '$.mark' });
      const failOnce = new sfn.CustomState(s, 'Fail Once', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::failOnce', ResultPath: '$.done' } });
      return new sfn.Parallel(s, 'Branch', { resultPath: sfn.JsonPath.DISCARD }).branch(mark.next(failOnce));
    });
    const sim = await Simulator.start(stack, { taskHandlers: { 'Fail Once': failsFirstRun(inputs) } });
    try {
      const again = await failThenRedrive(sim, sm, { job: 'a' });

      expect(again.status).toBe('SUCCEEDED');
      // The state's own input (with what the branch's first state added), not the Parallel's.
      expect(inputs).toEqual([{ job: 'a', mark: { ticket: 7 } }, { job: 'a', mark: { ticket: 7 } }]);
      // The branch's first state did not run again, and the simulator's own resume state is invisible.
      expect([...again.stateTransitions.keys()]).toEqual(['Branch', 'Mark', 'Fail Once']);
      expect(again.stateTransitions.get('Mark')).toBe(1);
      expect(again.history.filter((h) => h.name?.startsWith(REDRIVE_RESUME))).toEqual([]);
    } finally {
      await sim.stop();
    }
  });

  test('a redrive of an execution that stopped inside a Map iteration is refused, naming the state', async () => {
    const { stack, sm } = machineStack((s) => {
      const work = new sfn.CustomState(s, 'Item Work', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::itemWork' } });
      return new sfn.Map(s, 'Each', { itemsPath: '$.items' }).itemProcessor(work);
    });
    const sim = await Simulator.start(stack, {
      taskHandlers: {
        'Item Work': async () => {
          throw Object.assign(new Error('no'), { name: 'ItemFailed' });
        },
      },
    });
    try {
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)), { items: [1, 2] }).done;
      expect(e.status).toBe('FAILED');
      expect(() => sim.redriveExecution(e.arn)).toThrow("the simulator cannot redrive an execution that stopped inside a Map iteration (state 'Item Work')");
    } finally {
      await sim.stop();
    }
  });

  test('States.MathRandom excludes its end and draws from the seeded generator; ResultPath "$" replaces the data', async () => {
    const { stack, sm } = machineStack((s) =>
      new sfn.Pass(s, 'Draw', { parameters: { one: sfn.JsonPath.mathRandom(1, 2), any: sfn.JsonPath.mathRandom(1, 1000) } }).next(
        new sfn.Pass(s, 'Replace', { parameters: { 'drawn.$': '$' }, resultPath: '$' }),
      ),
    );
    const sim = await Simulator.start(stack);
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      // Started in the same millisecond: the interpreter's own generator would draw the same numbers.
      const runs = await Promise.all(Array.from({ length: 20 }, () => sim.startExecution(machine).done));

      const outputs = runs.map((r) => r.output as { drawn: { one: number; any: number } });
      expect(outputs.every((o) => Object.keys(o).join() === 'drawn')).toBe(true);
      expect(new Set(outputs.map((o) => o.drawn.one))).toEqual(new Set([1]));
      expect(new Set(outputs.map((o) => o.drawn.any)).size).toBeGreaterThan(15);
    } finally {
      await sim.stop();
    }
  });

  test("States.Hash gives lower-case hex, nested in States.Format with States.StringSplit and the context's names: the holder id's intrinsics", async () => {
    const { stack, sm } = machineStack((s) =>
      new sfn.Pass(s, 'Key', {
        parameters: {
          own: ownHolderKey(),
          fromEvent: holderKeyAt('$.stateMachineArn', '$.executionArn'),
          sha1: sfn.JsonPath.hash('input data', 'SHA-1'),
        },
      }),
    );
    const sim = await Simulator.start(stack);
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const md5 = (text: string) => createHash('md5').update(text).digest('hex');
      const other = { stateMachineArn: 'arn:aws:states:eu-west-1:123456789012:stateMachine:Other-Machine_1', executionArn: 'arn:aws:states:eu-west-1:123456789012:execution:Other-Machine_1:a-b_c' };
      const run = await sim.startExecution(machine, other, { name: 'named-run' }).done;
      expect(machine.arn).toMatch(/^arn:aws:states:[a-z0-9-]+:\d{12}:stateMachine:[^:]+$/);
      expect(run.output).toEqual({
        own: `${md5(machine.arn)}:named-run`,
        fromEvent: `${md5(other.stateMachineArn)}:a-b_c`,
        // AWS's example of States.Hash (the intrinsic functions page prints it with a digit missing).
        sha1: 'aaff4a450a104cd177d28d18d74485e8cae074b7',
      });
      expect(run.output).toMatchObject({ own: run.holderId, fromEvent: executionHolderKeyOfArn(other.executionArn) });
    } finally {
      await sim.stop();
    }
  });

  test('a Pass state\'s Result is its output whatever its value: 0, false and "" too', async () => {
    const results = [sfn.Result.fromNumber(0), sfn.Result.fromBoolean(false), sfn.Result.fromString(''), sfn.Result.fromNumber(7)];
    const { stack, sm } = machineStack((s) => {
      let chain = sfn.Chain.start(new sfn.Pass(s, 'Start'));
      results.forEach((result, i) => (chain = chain.next(new sfn.Pass(s, `Set ${i}`, { result, resultPath: `$.r${i}` }))));
      return chain;
    });
    const sim = await Simulator.start(stack);
    try {
      const run = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)), { keep: 1 }).done;
      expect(run.output).toEqual({ keep: 1, r0: 0, r1: false, r2: '', r3: 7 });
    } finally {
      await sim.stop();
    }
  });

  test('a Choice rule\'s type test with false matches when the test fails: IsPresent, IsNull, IsNumeric, IsString, IsBoolean, IsTimestamp', async () => {
    // Each Choice records which rule matched; the value under test is `$.v`, absent in the first run.
    const tests: Array<[string, (path: string) => sfn.Condition]> = [
      ['present', (p) => sfn.Condition.isNotPresent(p)],
      ['null', (p) => sfn.Condition.isNotNull(p)],
      ['numeric', (p) => sfn.Condition.isNotNumeric(p)],
      ['string', (p) => sfn.Condition.isNotString(p)],
      ['boolean', (p) => sfn.Condition.isNotBoolean(p)],
      ['timestamp', (p) => sfn.Condition.isNotTimestamp(p)],
    ];
    const { stack, sm } = machineStack((s) => {
      let chain = sfn.Chain.start(new sfn.Pass(s, 'Start'));
      for (const [name, not] of tests) {
        const yes = new sfn.Pass(s, `Not ${name}`, { result: sfn.Result.fromBoolean(true), resultPath: `$.not_${name}` });
        const no = new sfn.Pass(s, `Is ${name}`, { result: sfn.Result.fromBoolean(false), resultPath: `$.not_${name}` });
        const choice = new sfn.Choice(s, `${name}?`).when(not('$.v'), yes).otherwise(no);
        const next = new sfn.Pass(s, `After ${name}`);
        yes.next(next);
        no.next(next);
        chain = chain.next(choice.afterwards());
        chain = sfn.Chain.sequence(chain, next);
      }
      return chain;
    });
    const sim = await Simulator.start(stack);
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const outcome = async (input: object) => {
        const run = await sim.startExecution(machine, input).done;
        const { v: _v, ...nots } = run.output as Record<string, boolean>;
        return nots;
      };
      // Absent: "IsPresent": false matches (what the other tests do with a missing path is not asked here).
      const absent = await sim.startExecution(machine, {}).done;
      expect([absent.stateTransitions.has('Not present'), absent.stateTransitions.has('Is present')]).toEqual([true, false]);
      // A present value: "not present" fails; each other test fails only for its own kind of value.
      const only = (...kinds: string[]) => ({
        not_present: false,
        ...Object.fromEntries(['null', 'numeric', 'string', 'boolean', 'timestamp'].map((k) => [`not_${k}`, !kinds.includes(k)])),
      });
      expect(await outcome({ v: 'text' })).toEqual(only('string'));
      expect(await outcome({ v: null })).toEqual(only('null'));
      expect(await outcome({ v: 3 })).toEqual(only('numeric'));
      expect(await outcome({ v: true })).toEqual(only('boolean'));
      expect(await outcome({ v: '2026-11-30T08:00:00Z' })).toEqual(only('string', 'timestamp'));
    } finally {
      await sim.stop();
    }
  });

  test('States.JsonToString gives JSON text that States.StringToJson reads back, backslashes and all', async () => {
    const { stack, sm } = machineStack((s) =>
      new sfn.Pass(s, 'Encode', {
        parameters: {
          text: sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$.value')),
          greeting: sfn.JsonPath.format('hello {}', sfn.JsonPath.stringAt('$.value.q')),
        },
      }).next(new sfn.Pass(s, 'Decode', { parameters: { value: sfn.JsonPath.stringToJson(sfn.JsonPath.stringAt('$.text')), greeting: sfn.JsonPath.stringAt('$.greeting') } })),
    );
    const sim = await Simulator.start(stack);
    try {
      const value = { q: 'a "quoted" back\\slash', n: [1, 'ü'] };
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)), { value }).done;
      expect(e.output).toEqual({ value, greeting: `hello ${value.q}` });
    } finally {
      await sim.stop();
    }
  });

  test('a task whose input after Parameters exceeds 256 KiB fails with States.DataLimitExceeded, without retries', async () => {
    let calls = 0;
    const { stack, sm } = machineStack((s) =>
      new sfn.CustomState(s, 'Store', {
        stateJson: {
          Type: 'Task',
          Resource: 'arn:aws:states:::store',
          Parameters: { 'text.$': 'States.JsonToString($)' },
          Retry: [{ ErrorEquals: ['States.ALL'], MaxAttempts: 3 }],
        },
      }),
    );
    const sim = await Simulator.start(stack, { taskHandlers: { Store: async () => ++calls } });
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      // 100,000 quotes: 200 KB of input; as escaped JSON text inside the parameters, 400 KB.
      const tooLarge = await sim.startExecution(machine, { q: '"'.repeat(100_000) }).done;
      expect([tooLarge.status, tooLarge.error]).toEqual(['FAILED', 'States.DataLimitExceeded']);
      expect(calls).toBe(0);
      const fits = await sim.startExecution(machine, { q: 'x'.repeat(100_000) }).done;
      expect([fits.status, calls]).toEqual(['SUCCEEDED', 1]);
    } finally {
      await sim.stop();
    }
  });

  test('States.ALL and States.TaskFailed do not catch States.DataLimitExceeded; a catcher naming it does', async () => {
    const { stack, sm } = machineStack((s) => {
      // Any task will do: the simulator runs the handlers below in their place.
      const task = (id: string) =>
        new tasks.CallAwsService(s, id, {
          service: 'sqs',
          action: 'sendMessage',
          iamResources: ['*'],
          parameters: { MessageBody: sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$')) },
        });
      const store = task('Store');
      const named = task('Store Again');
      const taskFailed = task('Store Once More');
      store.addCatch(new sfn.Pass(s, 'Caught By All'), { errors: ['States.ALL'] });
      named.addCatch(new sfn.Pass(s, 'Caught By Name'), { errors: ['States.DataLimitExceeded'] });
      taskFailed.addRetry({ errors: ['States.TaskFailed'], maxAttempts: 2 }).addCatch(new sfn.Pass(s, 'Caught By TaskFailed'), { errors: ['States.TaskFailed'] });
      return new sfn.Choice(s, 'Which')
        .when(sfn.Condition.isPresent('$.named'), named)
        .when(sfn.Condition.isPresent('$.taskFailed'), taskFailed)
        .otherwise(store);
    });
    const handler = async () => 1;
    const sim = await Simulator.start(stack, { taskHandlers: { 'Store': handler, 'Store Again': handler, 'Store Once More': handler } });
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const q = '"'.repeat(100_000);
      const all = await sim.startExecution(machine, { q }).done;
      expect([all.status, all.error, all.stateTransitions.has('Caught By All')]).toEqual(['FAILED', 'States.DataLimitExceeded', false]);
      const named = await sim.startExecution(machine, { q, named: true }).done;
      expect([named.status, named.stateTransitions.get('Caught By Name')]).toEqual(['SUCCEEDED', 1]);
      // Nor does States.TaskFailed catch or retry it.
      const taskFailed = await sim.startExecution(machine, { q, taskFailed: true }).done;
      expect([taskFailed.status, taskFailed.error, taskFailed.stateTransitions.has('Caught By TaskFailed')]).toEqual(['FAILED', 'States.DataLimitExceeded', false]);
      expect(taskFailed.stateTransitions.get('Store Once More')).toBe(1);
    } finally {
      await sim.stop();
    }
  });

  test('a state whose output exceeds 256 KiB fails the execution with States.DataLimitExceeded', async () => {
    let after = 0;
    const { stack, sm } = machineStack((s) =>
      new sfn.CustomState(s, 'Grow', {
        stateJson: { Type: 'Task', Resource: 'arn:aws:states:::grow', ResultPath: '$.more' },
      }).next(new sfn.CustomState(s, 'After', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::after' } })),
    );
    const sim = await Simulator.start(stack, {
      taskHandlers: { Grow: async () => 'y'.repeat(140_000), After: async () => ++after },
    });
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      // Input and result fit alone (140 KB each); the output that holds both does not.
      const tooLarge = await sim.startExecution(machine, { x: 'x'.repeat(140_000) }).done;
      expect([tooLarge.status, tooLarge.error]).toEqual(['FAILED', 'States.DataLimitExceeded']);
      expect(tooLarge.cause).toMatch(/'Grow' has an output of \d+ bytes/);
      // It fails at the state, as on AWS: the next state is never entered, its task never called.
      expect([tooLarge.stateTransitions.has('After'), after]).toEqual([false, 0]);
      const fits = await sim.startExecution(machine, { x: 'x' }).done;
      expect([fits.status, fits.output]).toEqual(['SUCCEEDED', after]);
    } finally {
      await sim.stop();
    }
  });

  test('a Task without TimeoutSeconds does not time out after 60 s', async () => {
    const { stack, sm } = machineStack((s) => new sfn.CustomState(s, 'Slow', { stateJson: { Type: 'Task', Resource: 'arn:aws:states:::slow' } }));
    const sim = await Simulator.start(stack, {
      taskHandlers: { Slow: async (_input, context) => context.simulator.sleep(120).then(() => 'done') },
    });
    try {
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any))).done;
      expect([e.status, e.output]).toEqual(['SUCCEEDED', 'done']);
    } finally {
      await sim.stop();
    }
  });
});

describe('Lambda functions, schedules and the Step Functions API', () => {
  test('runs a function from its asset directory, with the AWS SDK reaching the simulated DynamoDB', async () => {
    const code = fs.mkdtempSync(path.join(os.tmpdir(), 'sim-fn-'));
    fs.writeFileSync(
      path.join(code, 'index.js'),
      `const { DynamoDBClient, PutItemCommand } = require('@aws-sdk/client-dynamodb');
       const client = new DynamoDBClient({});
       exports.handler = async (event) => {
         await client.send(new PutItemCommand({ TableName: process.env.TABLE, Item: { pk: { S: event.id } } }));
         return { stored: event.id };
       };`,
    );
    const { stack, sm } = machineStack((s, table) => {
      // A timeout of a minute: 600 ms of real time here, enough to load the AWS SDK on a busy machine.
      const fn = new lambda.Function(s, 'Store', {
        runtime: lambda.Runtime.NODEJS_18_X,
        handler: 'index.handler',
        code: lambda.Code.fromAsset(code),
        timeout: Duration.minutes(1),
      });
      fn.addEnvironment('TABLE', table.tableName);
      return new tasks.LambdaInvoke(s, 'Invoke Store', { lambdaFunction: fn, payloadResponseOnly: true });
    });
    const sim = await Simulator.start(stack);
    try {
      const e = await sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)), { id: 'from-lambda' }).done;

      expect(e.output).toEqual({ stored: 'from-lambda' });
      expect((await sim.scan('Table')).map((i) => i.pk.S)).toEqual(['from-lambda']);
    } finally {
      await sim.stop();
    }
  });

  test('a function a rule invokes asynchronously that fails is invoked twice more, about 1 and 2 minutes later, then reported', async () => {
    const stack = new Stack(new App(), 'Async');
    const fn = new lambda.Function(stack, 'Failing', {
      runtime: lambda.Runtime.NODEJS_18_X,
      handler: 'index.handler',
      code: lambda.Code.fromInline("exports.handler = async () => { const e = new Error('no'); e.name = 'Boom'; throw e; };"),
    });
    new events.Rule(stack, 'Every5Minutes', { schedule: events.Schedule.rate(Duration.minutes(5)), targets: [new targets.LambdaFunction(fn)] });
    const sim = await Simulator.start(stack, { schedules: false });
    try {
      const started = sim.now();
      await sim.fireScheduledRules();
      expect(sim.lambdaInvocations.get(logicalId(fn.node.defaultChild as any))).toBe(3);
      expect((sim.now() - started) / 1000).toBeGreaterThanOrEqual(180);
      expect(sim.asyncFailures).toEqual([expect.objectContaining({ functionLogicalId: logicalId(fn.node.defaultChild as any), error: 'Boom' })]);
    } finally {
      await sim.stop();
    }
  });

  test('a function that runs past its Timeout fails the task with Lambda.Unknown, a registered handler too; Lambda service errors can be injected', async () => {
    let slowFunction!: lambda.Function;
    const { stack, sm } = machineStack((s) => {
      const fn = new lambda.Function(s, 'Slow', {
        runtime: lambda.Runtime.NODEJS_18_X,
        handler: 'index.handler',
        timeout: Duration.seconds(3),
        // Two real seconds: 200 simulated ones at the tests' time scale.
        code: lambda.Code.fromInline('exports.handler = async (e) => { if (e.slow) await new Promise((r) => setTimeout(r, 2000)); return { ok: true }; };'),
      });
      slowFunction = fn;
      return new tasks.LambdaInvoke(s, 'Invoke Slow', { lambdaFunction: fn, payloadResponseOnly: true });
    });
    const sim = await Simulator.start(stack);
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const slow = await sim.startExecution(machine, { slow: true }).done;
      expect([slow.status, slow.error]).toEqual(['FAILED', 'Lambda.Unknown']);
      expect(slow.cause).toMatch(/^The cause could not be determined because Lambda did not return an error type\. Returned payload: .*Task timed out after 3\.00 seconds/);
      const quick = await sim.startExecution(machine, {}).done;
      expect([quick.status, quick.output]).toEqual(['SUCCEEDED', { ok: true }]);
    } finally {
      await sim.stop();
    }
    // A handler registered in the function's place runs under the same Timeout.
    const functionId = logicalId(slowFunction.node.defaultChild as any);
    const registered = await Simulator.start(stack, {
      lambdaHandlers: {
        [functionId]: async (input: any, context) => {
          await context.simulator.sleep(input.seconds);
          return { ok: true };
        },
      },
    });
    try {
      const machine = registered.stateMachine(logicalId(sm.node.defaultChild as any));
      const late = await registered.startExecution(machine, { seconds: 4 }).done;
      expect([late.status, late.error]).toEqual(['FAILED', 'Lambda.Unknown']);
      expect(late.cause).toMatch(/Task timed out after 3\.00 seconds/);
      const inTime = await registered.startExecution(machine, { seconds: 2 }).done;
      expect([inTime.status, inTime.output]).toEqual(['SUCCEEDED', { ok: true }]);
    } finally {
      await registered.stop();
    }
    const faulty = await Simulator.start(stack, { lambdaServiceErrorRate: 1 });
    try {
      const e = await faulty.startExecution(faulty.stateMachine(logicalId(sm.node.defaultChild as any)), {}).done;
      expect(e.status).toBe('FAILED');
      expect(['Lambda.ServiceException', 'Lambda.AWSLambdaException', 'Lambda.SdkClientException', 'Lambda.TooManyRequestsException']).toContain(e.error);
      expect([...faulty.lambdaInvocations.values()].reduce((a, b) => a + b, 0)).toBe(0);
    } finally {
      await faulty.stop();
    }
  });

  test('a rule that cannot start its state machine retries as its RetryPolicy says, then records the event for its dead-letter queue', async () => {
    const stack = new Stack(new App(), 'Targets');
    const sm = new sfn.StateMachine(stack, 'Machine', { definitionBody: sfn.DefinitionBody.fromChainable(new sfn.Pass(stack, 'Done')) });
    const dlq = new sqs.Queue(stack, 'Dlq');
    new events.Rule(stack, 'OnJob', {
      eventPattern: { source: ['test.jobs'] },
      targets: [new targets.SfnStateMachine(sm, { retryAttempts: 3, maxEventAge: Duration.hours(1), deadLetterQueue: dlq })],
    });
    const event = { 'source': 'test.jobs', 'detail-type': 'Job', 'detail': { id: 1 } };
    const sim = await Simulator.start(stack, { eventFaults: { targetFailureRate: 1 } });
    try {
      const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
      const started = sim.now();
      sim.putEvent(event);
      await sim.idle();
      // Every attempt failed: the first and three retries, with backoff between them, then the dead-letter queue.
      expect(sim.failedTargetDeliveries).toBe(4);
      expect(sim.executionsOf(machine)).toEqual([]);
      expect(sim.undeliveredEvents).toEqual([{ rule: expect.stringMatching(/^OnJob/), target: machine.arn, deadLetterQueue: expect.stringContaining(':sqs:'), event }]);
      expect(sim.now()).toBeGreaterThan(started);

      // Half of the attempts fail: a retry gets it through.
      sim.eventFaults = { targetFailureRate: 0.5 };
      for (let i = 0; i < 4; i++) sim.putEvent(event);
      await sim.idle();
      expect(sim.executionsOf(machine).length + sim.undeliveredEvents.length - 1).toBe(4);
      expect(sim.executionsOf(machine).length).toBeGreaterThanOrEqual(3);
    } finally {
      await sim.stop();
    }
  });

  test('staleReads: a Lambda function\'s eventually consistent DynamoDB read is refused with a ValidationException naming the gap; a consistent one is served', async () => {
    const { stack, sm } = machineStack((s, t) => {
      const fn = new lambda.Function(s, 'Reader', {
        runtime: lambda.Runtime.NODEJS_22_X,
        handler: 'index.handler',
        // Not the default 3 s: that is 30 ms of real time for a real SDK call at the tests' time scale.
        timeout: Duration.minutes(1),
        environment: { TABLE: t.tableName },
        code: lambda.Code.fromInline(
          `const ddb = require('@aws-sdk/client-dynamodb');
           const client = new ddb.DynamoDBClient({ maxAttempts: 1 });
           exports.handler = async (event) => {
             const input = { TableName: process.env.TABLE, ConsistentRead: event.consistent };
             if (event.scan) return (await client.send(new ddb.ScanCommand(input))).Count;
             const out = await client.send(new ddb.GetItemCommand({ ...input, Key: { pk: { S: 'a' } } }));
             return out.Item ? out.Item.pk.S : 'none';
           };`,
        ),
      });
      t.grantReadData(fn);
      return new tasks.LambdaInvoke(s, 'Read', { lambdaFunction: fn, payloadResponseOnly: true });
    });
    const read = async (options: { staleReads?: { windowSeconds: number; rate: number } }, inputs: object[]) => {
      const sim = await Simulator.start(stack, options);
      try {
        const machine = sim.stateMachine(logicalId(sm.node.defaultChild as any));
        const results = [];
        for (const input of inputs) results.push(await sim.startExecution(machine, input).done);
        return { results, refused: sim.codeDynamoDb.refused };
      } finally {
        await sim.stop();
      }
    };
    const inputs = [{ consistent: false }, { consistent: true }, { scan: true }, { scan: true, consistent: true }];
    const stale = await read({ staleReads: { windowSeconds: 5, rate: 0.5 } }, inputs);
    expect(stale.results.map((e) => e.status)).toEqual(['FAILED', 'SUCCEEDED', 'FAILED', 'SUCCEEDED']);
    expect(stale.results[0].error).toBe('ValidationException');
    expect(stale.results[0].cause).toMatch(/the simulator refuses an eventually consistent GetItem on .* \(staleReads is on\).*Set ConsistentRead: true, or test this read on AWS/);
    expect(stale.results[2].cause).toMatch(/eventually consistent Scan/);
    expect(stale.results[1].output).toBe('none');
    expect(stale.results[3].output).toBe(0);
    expect(stale.refused.map((r) => r.action)).toEqual(['GetItem', 'Scan']);
    // Without staleReads the same reads are served (DynamoDB would answer them, maybe stale).
    const current = await read({}, [{ consistent: false }, { scan: true }]);
    expect(current.results.map((e) => [e.status, e.output])).toEqual([['SUCCEEDED', 'none'], ['SUCCEEDED', 0]]);
  });

  test('fires a rate() rule on the simulated clock; its function sees the Step Functions API', async () => {
    const stack = new Stack(new App(), 'Sched');
    const sm = new sfn.StateMachine(stack, 'Machine', {
      definitionBody: sfn.DefinitionBody.fromChainable(new sfn.Wait(stack, 'Long', { time: sfn.WaitTime.duration(Duration.hours(1)) })),
    });
    const fn = new lambda.Function(stack, 'Sweeper', {
      runtime: lambda.Runtime.NODEJS_18_X,
      handler: 'index.handler',
      environment: { STATE_MACHINE: sm.stateMachineArn },
      code: lambda.Code.fromInline(
        `const sfn = require('@aws-sdk/client-sfn');
         const client = new sfn.SFNClient({});
         exports.handler = async () => {
           const { executions } = await client.send(new sfn.ListExecutionsCommand({ stateMachineArn: process.env.STATE_MACHINE, statusFilter: 'RUNNING' }));
           for (const e of executions) await client.send(new sfn.StopExecutionCommand({ executionArn: e.executionArn, error: 'Swept', cause: 'by the schedule' }));
           return executions.length;
         };`,
      ),
    });
    new events.Rule(stack, 'Every5Minutes', { schedule: events.Schedule.rate(Duration.minutes(5)), targets: [new targets.LambdaFunction(fn)] });
    const sim = await Simulator.start(stack);
    try {
      const e = sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)));
      await e.done;

      expect([e.status, e.error, e.cause]).toEqual(['ABORTED', 'Swept', 'by the schedule']);
      const waited = (e.stopDate! - e.startDate) / 1000;
      expect(waited).toBeGreaterThan(200);
      expect(waited).toBeLessThan(600);
      expect(sim.lambdaInvocations.get(logicalId(fn.node.defaultChild as any))).toBeGreaterThanOrEqual(1);

      // The same API, from the test, through the SDK.
      const client = new SFNClient({ endpoint: sim.sfnApi!.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'a', secretAccessKey: 'b' } });
      const described = await client.send(new DescribeExecutionCommand({ executionArn: e.arn }));
      expect(described).toMatchObject({ status: 'ABORTED', error: 'Swept', name: e.name });
      expect(described.startDate).toBeInstanceOf(Date);
      await expect(client.send(new StopExecutionCommand({ executionArn: `${e.arn}-missing` }))).rejects.toMatchObject({ name: 'ExecutionDoesNotExist' });
      const listed = await client.send(new ListExecutionsCommand({ stateMachineArn: e.stateMachine.arn }));
      expect(listed.executions?.map((x) => x.executionArn)).toEqual([e.arn]);
      client.destroy();
    } finally {
      await sim.stop();
    }
  });
});

test('a function\'s Date is the simulated clock, and a date the AWS SDK parses is still instanceof Date in it', async () => {
  const stack = new Stack(new App(), 'Dates');
  const sm = new sfn.StateMachine(stack, 'Machine', { definitionBody: sfn.DefinitionBody.fromChainable(new sfn.Pass(stack, 'Done')) });
  const fn = new lambda.Function(stack, 'Describer', {
    runtime: lambda.Runtime.NODEJS_18_X,
    handler: 'index.handler',
    timeout: Duration.minutes(15),
    code: lambda.Code.fromInline(
      `const sfn = require('@aws-sdk/client-sfn');
       const client = new sfn.SFNClient({});
       exports.handler = async (event) => {
         const d = await client.send(new sfn.DescribeExecutionCommand({ executionArn: event.executionArn }));
         return { isDate: d.stopDate instanceof Date, stopMs: d.stopDate.getTime(), now: Date.now(), made: new Date() instanceof Date };
       };`,
    ),
  });
  // Ten minutes in 0.6 s: the function's clock runs with the simulation's, not the machine's.
  const sim = await Simulator.start(stack, { timeScale: 0.001 });
  try {
    const e = sim.startExecution(sim.stateMachine(logicalId(sm.node.defaultChild as any)));
    await e.done;
    await sim.sleep(600);
    const seen = (await sim.invokeFunction(logicalId(fn.node.defaultChild as any), { executionArn: e.arn })) as Record<string, unknown>;
    // The SDK's Date is the real one; the function's is the simulation's: on Lambda there is one Date.
    expect(seen).toMatchObject({ isDate: true, made: true, stopMs: e.stopDate });
    expect(seen.now as number).toBeGreaterThanOrEqual(e.stopDate! + 600_000);
    expect(seen.now as number).toBeGreaterThan(Date.now() + 500_000);
  } finally {
    await sim.stop();
  }
});

test('one simulator at a time: a second start fails clearly until the first stops', async () => {
  const { stack } = workflowStack();
  const sim = await Simulator.start(stack);
  try {
    await expect(Simulator.start(stack)).rejects.toThrow(/a simulator is already running in this process/);
  } finally {
    await sim.stop();
  }
  const again = await Simulator.start(stack);
  await again.stop();
  expect(again.executions.size).toBe(0);
});

test('a stopped execution\'s status event goes out at once, while its call is still on its way', async () => {
  const { stack, workflow } = workflowStack();
  let landWrite!: () => void;
  const sim = await Simulator.start(stack, {
    // The acquire's call hangs until the test lets it land.
    taskHandlers: { 'Acquire Permit': () => new Promise((resolve) => (landWrite = () => resolve({}))) },
  });
  try {
    const started: string[] = [];
    const ended: string[] = [];
    sim.onTaskStarted((_, stateName) => started.push(stateName));
    sim.onTaskEnded((_, stateName) => ended.push(stateName));
    const execution = sim.startExecution(sim.stateMachine(logicalId(workflow.stateMachine.node.defaultChild as any)), {});
    await until(() => started.length > 0, 'the acquire started');
    expect(started).toEqual(['Acquire Permit']);
    // Started, not answered yet.
    expect(ended).toEqual([]);
    expect(landWrite).toBeDefined();
    execution.abort('Test.Stop', 'stopped while acquiring');
    // Stopped while the call still hangs (waited for, not timed: the run ends a moment after the stop).
    await until(() => execution.status !== 'RUNNING', 'the execution to stop');

    expect(execution.status).toBe('ABORTED');
    expect(sim.events.filter((e) => e.detail.executionArn === execution.arn).map((e) => e.detail.status)).toEqual(['RUNNING', 'ABORTED']);
    landWrite();
    await sim.idle();
    expect(ended.filter((name) => name === 'Acquire Permit')).toEqual(['Acquire Permit']);
  } finally {
    await sim.stop();
  }
});

describe('callbacks: .waitForTaskToken', () => {
  /**
   * A state machine whose "Wait For Callback" task writes its token to the table with the AWS SDK
   * integration and then waits, and a "Notify" machine that sends SendTaskSuccess from a task,
   * catching a closed token.
   */
  function callbackStack(waitProps: { heartbeat?: Duration; timeout?: Duration; retry?: boolean; catchErrors?: string[] } = {}) {
    const stack = new Stack(new App(), 'Sim');
    const table = new dynamodb.Table(stack, 'Table', { partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING } });
    const waitForCallback = new tasks.CallAwsService(stack, 'Wait For Callback', {
      service: 'dynamodb',
      action: 'putItem',
      integrationPattern: sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
      iamResources: [table.tableArn],
      parameters: { TableName: table.tableName, Item: { pk: { S: 'waiter' }, token: { S: sfn.JsonPath.taskToken } } },
      heartbeatTimeout: waitProps.heartbeat && sfn.Timeout.duration(waitProps.heartbeat),
      taskTimeout: waitProps.timeout && sfn.Timeout.duration(waitProps.timeout),
    });
    if (waitProps.retry) waitForCallback.addRetry({ errors: ['States.HeartbeatTimeout'], maxAttempts: 1, interval: Duration.seconds(1) });
    if (waitProps.catchErrors) waitForCallback.addCatch(new sfn.Pass(stack, 'Caught'), { errors: waitProps.catchErrors });
    const waiter = new sfn.StateMachine(stack, 'Waiter', { definitionBody: sfn.DefinitionBody.fromChainable(waitForCallback) });
    const notify = new tasks.CallAwsService(stack, 'Notify', {
      service: 'sfn',
      action: 'sendTaskSuccess',
      iamResources: ['*'],
      parameters: { TaskToken: sfn.JsonPath.stringAt('$.token'), Output: sfn.JsonPath.jsonToString(sfn.JsonPath.objectAt('$.output')) },
    }).addCatch(new sfn.Pass(stack, 'Token Closed', { parameters: { closed: true } }), { errors: ['Sfn.TaskTimedOutException'] });
    const notifier = new sfn.StateMachine(stack, 'Notifier', { definitionBody: sfn.DefinitionBody.fromChainable(notify) });
    return { stack, waiter: logicalId(waiter.node.defaultChild as any), notifier: logicalId(notifier.node.defaultChild as any) };
  }

  async function storedToken(sim: Simulator): Promise<string | undefined> {
    const items = await sim.scan('Table');
    return items.find((i) => i.pk.S === 'waiter')?.token?.S;
  }

  async function tokenOnceWritten(sim: Simulator, previous?: string): Promise<string> {
    for (let i = 0; i < 500; i++) {
      const token = await storedToken(sim);
      if (token && token !== previous) return token;
      await sim.sleep(0.1);
    }
    throw new Error('no token was written');
  }

  test('a callback task whose call fails leaves no timer behind: its TimeoutSeconds no longer holds the process open', async () => {
    const { stack, waiter } = callbackStack({ timeout: Duration.hours(1), catchErrors: ['Call.Failed'] });
    const refuse = () => {
      throw Object.assign(new Error('refused'), { name: 'Call.Failed' });
    };
    const sim = await Simulator.start(stack, { taskHandlers: { 'Wait For Callback': refuse } });
    try {
      const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
      const before = timers();
      const e = await sim.startExecution(sim.stateMachine(waiter)).done;
      expect([e.status, e.transitions]).toEqual(['SUCCEEDED', 2]);
      // Before 2026-11-30 the hour's timer stayed armed (a bench of the transactional queue's spike did not exit).
      expect(timers()).toBeLessThanOrEqual(before);
    } finally {
      await sim.stop();
    }
  });

  test('the call carries the token; SendTaskSuccess from another state machine ends the wait with its output; the token then closes', async () => {
    const { stack, waiter, notifier } = callbackStack();
    const sim = await Simulator.start(stack);
    try {
      const waiting = sim.startExecution(sim.stateMachine(waiter));
      const token = await tokenOnceWritten(sim);
      // As long as AWS's are in practice (the queue stores them, and DynamoDB bills by size).
      expect(token).toHaveLength(700);
      await sim.sleep(30);
      expect(waiting.status).toBe('RUNNING');

      const notified = await sim.startExecution(sim.stateMachine(notifier), { token, output: { granted: true } }).done;
      expect(notified.status).toBe('SUCCEEDED');
      await waiting.done;
      expect([waiting.status, waiting.output]).toEqual(['SUCCEEDED', { granted: true }]);

      // A second notification finds the token closed: TaskTimedOut, which the notifier catches.
      const late = await sim.startExecution(sim.stateMachine(notifier), { token, output: {} }).done;
      expect(late.output).toEqual({ closed: true });
      expect(() => sim.sendTaskSuccess(token, '{}')).toThrow(expect.objectContaining({ name: 'TaskTimedOut' }));
      expect(() => sim.sendTaskSuccess('not-a-token', '{}')).toThrow(expect.objectContaining({ name: 'InvalidToken' }));
      expect(sim.callbacks.openTokens).toBe(0);
    } finally {
      await sim.stop();
    }
  });

  test('SendTaskFailure fails the task with its error and cause', async () => {
    const { stack, waiter } = callbackStack();
    const sim = await Simulator.start(stack);
    try {
      const waiting = sim.startExecution(sim.stateMachine(waiter));
      sim.sendTaskFailure(await tokenOnceWritten(sim), 'Denied', 'no permit for you');
      await waiting.done;
      expect([waiting.status, waiting.error, waiting.cause]).toEqual(['FAILED', 'Denied', 'no permit for you']);
    } finally {
      await sim.stop();
    }
  });

  test('HeartbeatSeconds: heartbeats keep the task waiting; without them States.HeartbeatTimeout, and each retry has a token of its own', async () => {
    const { stack, waiter } = callbackStack({ heartbeat: Duration.seconds(10), retry: true });
    // Heartbeats 5 s apart against a 10 s timeout leave 5 s of margin: 50 ms of real time at the default
    // scale, which a loaded machine can take (a CI run with three Jest workers did); 500 ms at a tenth.
    const sim = await Simulator.start(stack, { timeScale: 0.1 });
    try {
      const waiting = sim.startExecution(sim.stateMachine(waiter));
      const first = await tokenOnceWritten(sim);
      for (let i = 0; i < 6; i++) {
        await sim.sleep(5);
        sim.sendTaskHeartbeat(first);
      }
      expect(waiting.status).toBe('RUNNING');

      // No more heartbeats: the attempt times out, the retry writes a new token.
      const second = await tokenOnceWritten(sim, first);
      expect(() => sim.sendTaskHeartbeat(first)).toThrow(expect.objectContaining({ name: 'TaskTimedOut' }));
      await waiting.done;
      expect([waiting.status, waiting.error]).toEqual(['FAILED', 'States.HeartbeatTimeout']);
      expect(() => sim.sendTaskSuccess(second, '{}')).toThrow(expect.objectContaining({ name: 'TaskTimedOut' }));
    } finally {
      await sim.stop();
    }
  });

  test('TimeoutSeconds ends the wait with States.Timeout; a stopped execution closes its token', async () => {
    const { stack, waiter } = callbackStack({ timeout: Duration.seconds(60) });
    const sim = await Simulator.start(stack);
    try {
      const timedOut = await sim.startExecution(sim.stateMachine(waiter)).done;
      expect([timedOut.status, timedOut.error]).toEqual(['FAILED', 'States.Timeout']);

      const previous = await storedToken(sim);
      const stopped = sim.startExecution(sim.stateMachine(waiter));
      const token = await tokenOnceWritten(sim, previous);
      stopped.abort();
      await stopped.done;
      expect(() => sim.sendTaskSuccess(token, '{}')).toThrow(expect.objectContaining({ name: 'TaskTimedOut' }));
    } finally {
      await sim.stop();
    }
  });

  // "States.TaskFailed ... matches any known error name except for States.Timeout"
  // (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html).
  test.each([
    [['States.TaskFailed'], 'FAILED'],
    [['States.Timeout'], 'SUCCEEDED'],
    [['States.ALL'], 'SUCCEEDED'],
  ])('a callback that times out: a catcher of %j gives %s', async (catchErrors, status) => {
    const { stack, waiter } = callbackStack({ timeout: Duration.seconds(5), catchErrors });
    const sim = await Simulator.start(stack);
    try {
      const run = await sim.startExecution(sim.stateMachine(waiter)).done;
      expect(run.status).toBe(status);
      expect(run.stateTransitions.has('Caught')).toBe(status === 'SUCCEEDED');
    } finally {
      await sim.stop();
    }
  });
});

describe('DynamoDB capacity, as DynamoDB bills and throttles it', () => {
  let db: LocalDynamoDb;
  let now = Date.parse('2026-11-25T12:00:00.500Z');
  const update = 'arn:aws:states:::dynamodb:updateItem';
  const key = (pk: string) => ({ TableName: 'Capacity', Key: { pk: { S: pk } } });
  /** Set attribute `big` of item `pk` to a string of `bytes` characters (or remove it). */
  const setBig = (pk: string, bytes?: number, condition?: string) => ({
    ...key(pk),
    UpdateExpression: bytes === undefined ? 'REMOVE big' : 'SET big = :big',
    ...(bytes === undefined ? {} : { ExpressionAttributeValues: { ':big': { S: 'x'.repeat(bytes) } } }),
    ...(condition ? { ConditionExpression: condition } : {}),
  });

  beforeAll(async () => {
    db = await LocalDynamoDb.start();
    await db.client.send(
      new CreateTableCommand({
        TableName: 'Capacity',
        KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
        AttributeDefinitions: [{ AttributeName: 'pk', AttributeType: 'S' }],
        BillingMode: 'PAY_PER_REQUEST',
      }),
    );
  });
  afterAll(() => db.stop());

  test('a write is billed by the larger item of before and after, a refused condition by the item, a read per 4 KB', async () => {
    const runner = new DynamoTaskRunner(db, seededRandom(1), async () => undefined, {}, {}, () => now);
    const units: Array<[number, number]> = [];
    const run = (resource: string, input: object) => runner.run(resource, input, (u) => units.push([u.write, u.read]));

    await run(update, setBig('billing', 10)); // a new, small item
    await run(update, setBig('billing', 5000)); // about 5 KB after
    await run(update, setBig('billing')); // about 5 KB before
    await run(update, setBig('billing', 5000));
    await expect(run(update, setBig('billing', 1, 'attribute_not_exists(pk)'))).rejects.toMatchObject({ name: 'DynamoDB.ConditionalCheckFailedException' });
    const read = await run('arn:aws:states:::dynamodb:getItem', { ...key('billing'), ConsistentRead: true });
    await run('arn:aws:states:::dynamodb:getItem', key('billing'));

    expect(units).toEqual([
      [1, 0], // 22 bytes
      [5, 0], // 5,012 bytes after
      [5, 0], // 5,012 bytes before
      [5, 0],
      [5, 0], // refused: the item as it is
      [0, 2], // strongly consistent: 2 x 4 KB
      [0, 1], // eventually consistent: half
    ]);
    expect([runner.writeUnits, runner.readUnits]).toEqual([21, 3]);
    // Measuring does not change what the task sees.
    expect(read).not.toHaveProperty('ConsumedCapacity');
  });

  test('a partition key over 1,000 write units a second is throttled, not applied; other keys are not, and the next second it is served', async () => {
    const runner = new DynamoTaskRunner(db, seededRandom(1), async () => undefined, {}, { partitionLimits: true }, () => now);
    // An item of about 100 KB: 100 write units a write.
    for (let i = 0; i < 10; i++) await runner.run(update, setBig('hot', 100 * 1024 - 100));
    expect(runner.writeUnits).toBe(1000);

    await expect(runner.run(update, setBig('hot', 10))).rejects.toMatchObject({ name: 'DynamoDB.ProvisionedThroughputExceededException' });
    await expect(runner.run('arn:aws:states:::aws-sdk:dynamodb:updateItem', setBig('hot', 10))).rejects.toMatchObject({
      name: 'DynamoDb.ProvisionedThroughputExceededException',
    });
    expect(runner.capacityThrottled).toBe(2);
    const item = await db.call('GetItem', { ...key('hot'), ConsistentRead: true });
    expect(((item.Item as any).big.S as string).length).toBe(100 * 1024 - 100); // not applied
    await runner.run(update, setBig('cold', 10));

    now += 1000;
    await runner.run(update, setBig('hot', 10));
    expect(runner.capacityThrottled).toBe(2);
  });

  test('items that share a partition key (a table with a sort key) share its 1,000 write units a second, transactions included', async () => {
    await db.client.send(
      new CreateTableCommand({
        TableName: 'Collection',
        KeySchema: [
          { AttributeName: 'pk', KeyType: 'HASH' },
          { AttributeName: 'sk', KeyType: 'RANGE' },
        ],
        AttributeDefinitions: [
          { AttributeName: 'pk', AttributeType: 'S' },
          { AttributeName: 'sk', AttributeType: 'S' },
        ],
        BillingMode: 'PAY_PER_REQUEST',
      }),
    );
    const runner = new DynamoTaskRunner(db, seededRandom(1), async () => undefined, {}, { partitionLimits: true }, () => now + 10_000);
    // The key's attributes in either order: the partition is the partition key's value.
    const write = (sk: string, bytes: number, pk = 'lock') => ({
      TableName: 'Collection',
      Key: sk < 'm' ? { pk: { S: pk }, sk: { S: sk } } : { sk: { S: sk }, pk: { S: pk } },
      UpdateExpression: 'SET big = :big',
      ExpressionAttributeValues: { ':big': { S: 'x'.repeat(bytes) } },
    });
    // Ten items of about 100 KB under one partition key: 1,000 write units in this second.
    for (const sk of ['a', 'b', 'c', 'd', 'e', 'p', 'q', 'r', 's', 't']) await runner.run(update, write(sk, 100 * 1024 - 100));
    expect(runner.writeUnits).toBe(1000);
    // A new item under the same partition key is throttled, as is a transaction that writes one.
    await expect(runner.run(update, write('z', 10))).rejects.toMatchObject({ name: 'DynamoDB.ProvisionedThroughputExceededException' });
    await expect(
      runner.run('arn:aws:states:::aws-sdk:dynamodb:transactWriteItems', { TransactItems: [{ Update: write('y', 10) }] }),
    ).rejects.toMatchObject({ name: 'DynamoDb.TransactionCanceledException', message: expect.stringMatching(/\[ThrottlingError\]$/) });
    expect(runner.capacityThrottled).toBe(2);
    // Another partition key of the same table is served.
    await runner.run(update, write('z', 10, 'other'));
    expect(runner.writeUnits).toBe(1001);
  });

  test('calls in flight at once count against their partition as they are admitted, not only when they complete', async () => {
    const runner = new DynamoTaskRunner(db, seededRandom(1), async () => undefined, {}, { partitionLimits: true }, () => now + 20_000);
    const write = (bytes: number) => ({ ...key('in-flight'), UpdateExpression: 'SET big = :big', ExpressionAttributeValues: { ':big': { S: 'x'.repeat(bytes) } } });
    // One write of about 100 KB: the partition now expects 100 units a write.
    await runner.run(update, write(100 * 1024 - 100));
    // Twenty more at once, as the waiters of a hot lock send them: nine fit in this second's 1,000 units.
    const outcomes = await Promise.allSettled(Array.from({ length: 20 }, () => runner.run(update, write(100 * 1024 - 100))));
    expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(9);
    expect(outcomes.filter((o) => o.status === 'rejected').map((o) => (o as PromiseRejectedResult).reason.name)).toEqual(
      Array(11).fill('DynamoDB.ProvisionedThroughputExceededException'),
    );
    expect(runner.writeUnits).toBe(1000);
    // A call that fails without a write (an invalid expression) gives back what it was admitted with.
    const later = new DynamoTaskRunner(db, seededRandom(1), async () => undefined, {}, { partitionLimits: true }, () => now + 30_000);
    await later.run(update, write(100 * 1024 - 100));
    // (The optimized integration names DynamoDB's ValidationException so.)
    const invalid = { ...write(10), UpdateExpression: 'SET big = :missing' };
    for (let i = 0; i < 5; i++) await expect(later.run(update, invalid)).rejects.toMatchObject({ name: 'DynamoDB.AmazonDynamoDBException' });
    const rest = await Promise.allSettled(Array.from({ length: 9 }, () => later.run(update, write(100 * 1024 - 100))));
    expect(rest.filter((o) => o.status === 'fulfilled')).toHaveLength(9);
    expect(later.writeUnits).toBe(1000);
  });

  test('code under test (functions, SDK clients) is billed and throttled by the same model, with DynamoDB\'s error names; the tasks\' injected faults do not reach it', async () => {
    const faults = { throttleRate: 1, serverErrorAfterWriteRate: 1 };
    const runner = new DynamoTaskRunner(db, seededRandom(1), async () => undefined, faults, { partitionLimits: true }, () => now);
    const endpoint = await CodeDynamoDbEndpoint.start(db, runner, false);
    const client = new DynamoDBClient({ endpoint: endpoint.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'a', secretAccessKey: 'b' }, maxAttempts: 1 });
    try {
      const write = (pk: string, bytes: number) =>
        client.send(new UpdateItemCommand({ ...key(pk), UpdateExpression: 'SET big = :big', ExpressionAttributeValues: { ':big': { S: 'x'.repeat(bytes) } } }));
      for (let i = 0; i < 10; i++) await write('code-hot', 100 * 1024 - 100);
      expect(runner.writeUnits).toBe(1000);
      await expect(write('code-hot', 10)).rejects.toMatchObject({ name: 'ProvisionedThroughputExceededException' });
      expect(runner.capacityThrottled).toBe(1);
      // A refused condition is billed, and named as DynamoDB names it.
      await expect(
        client.send(new UpdateItemCommand({ ...key('code-cold'), UpdateExpression: 'SET a = :a', ConditionExpression: 'attribute_exists(pk)', ExpressionAttributeValues: { ':a': { S: 'x' } } })),
      ).rejects.toMatchObject({ name: 'ConditionalCheckFailedException' });
      expect(runner.writeUnits).toBe(1001);
      // Reads are served and billed; table management passes through.
      const read = await client.send(new GetItemCommand({ ...key('code-hot'), ConsistentRead: true }));
      expect((read.Item!.big.S as string).length).toBe(100 * 1024 - 100);
      expect(read.ConsumedCapacity).toBeUndefined();
      expect(runner.readUnits).toBe(25);
      expect((await client.send(new DescribeTableCommand({ TableName: 'Capacity' }))).Table!.TableName).toBe('Capacity');
      expect(endpoint.calls).toBe(13);
    } finally {
      client.destroy();
      await endpoint.stop();
    }
  });
});

test('stopping DynamoDB answers the requests it has first: a call that outlived its execution does not crash dynalite', async () => {
  const db = await LocalDynamoDb.start();
  await db.call('CreateTable', {
    TableName: 'Closing',
    KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
    AttributeDefinitions: [{ AttributeName: 'pk', AttributeType: 'S' }],
    BillingMode: 'PAY_PER_REQUEST',
  });
  const uncaught: Error[] = [];
  const record = (e: Error) => uncaught.push(e);
  process.on('uncaughtException', record);
  try {
    // Writes to one item queue on its lock; before this, the database closed under the queue and
    // dynalite threw "Database is closed" from its callback.
    const add = { TableName: 'Closing', Key: { pk: { S: 'a' } }, UpdateExpression: 'ADD c :one', ExpressionAttributeValues: { ':one': { N: '1' } } };
    let answered = 0;
    const calls = Array.from({ length: 200 }, () => db.call('UpdateItem', add).then(() => (answered++, 1), () => 0));
    // Stop once the queue on the item is known to be running (a fixed delay left a slow machine
    // stopping before any request arrived, and then every call was refused and nothing was tested).
    const deadline = Date.now() + 10_000;
    while (answered === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 1));
    expect(answered).toBeGreaterThan(0);
    expect(answered).toBeLessThan(200);
    const answeredBeforeStop = answered;
    await db.stop();
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(uncaught).toEqual([]);
    // Every call settles. The requests dynalite had when told to stop were answered first (all 200 went
    // in at once, queued on the item's lock), and none succeeded that it did not receive (the table's
    // creation was one of those). The calls are served without HTTP; code under test still uses HTTP.
    const succeeded = (await Promise.all(calls)).reduce((a, b) => a + b, 0);
    expect(succeeded).toBeGreaterThan(answeredBeforeStop);
    expect(succeeded).toBeLessThanOrEqual(db.requestsReceived - 1);
    // A call after the stop is refused, not served by a closed database (whose error would be thrown uncaught).
    await expect(db.call('UpdateItem', add)).rejects.toThrow(/has stopped/);
    expect(uncaught).toEqual([]);
  } finally {
    process.off('uncaughtException', record);
  }
});

describe('the lock monitor', () => {
  test('reads the lock items written by any path (before it started, over HTTP, in a batch, in a transaction), never a ticket item, and sees what is wrong in them', async () => {
    const { stack } = workflowStack({ concurrencyLimit: 2 });
    const sim = await Simulator.start(stack);
    const table = sim.tableName('WorkflowLockTable');
    const holder = (n: number) => ({ M: { [HOLDER_ACQUIRED_AT]: { S: `2026-11-29T00:00:0${n}.000Z` } } });
    const lockItem = (name: string, permits: number, holders: number) => ({
      [LOCK_KEY]: { S: name },
      [PERMITS_IN_USE]: { N: `${permits}` },
      ...Object.fromEntries(Array.from({ length: holders }, (_, i) => [`holder-${i}`, holder(i)])),
    });
    // Every key the monitor reads.
    const read = new Set<string>();
    const getItems = sim.getItems.bind(sim);
    sim.getItems = async (tableName, keys) => {
      for (const key of keys) read.add((key[LOCK_KEY] as { S: string }).S);
      return getItems(tableName, keys);
    };
    try {
      // Written before the monitor starts: its first scan finds it. Consistent: 1 permit, 1 holder.
      await sim.db.call('PutItem', { TableName: table, Item: lockItem('before', 1, 1) });
      // Deleted once the monitor knows it, and written again: still read.
      await sim.db.call('PutItem', { TableName: table, Item: lockItem('again', 1, 1) });
      const monitor = new LockMonitor(sim, 'WorkflowLockTable', () => 2).start(5);
      await until(() => monitor.samples >= 2, 'a first sample');
      await sim.db.call('DeleteItem', { TableName: table, Key: { [LOCK_KEY]: { S: 'again' } } });
      await sim.db.call('PutItem', { TableName: table, Item: lockItem('again', 0, 1) });
      // Over HTTP, as code under test writes: 2 permits counted for 1 holder.
      await sim.db.client.send(new PutItemCommand({ TableName: table, Item: lockItem('http', 2, 1) }));
      // In a transaction: 3 permits, above the limit of 2, for 3 holders.
      await sim.db.client.send(new TransactWriteItemsCommand({ TransactItems: [{ Put: { TableName: table, Item: lockItem('transaction', 3, 3) } }] }));
      // Tickets far larger than any lock item, beside a lock item in the same batch.
      const token = 'x'.repeat(3000);
      const tickets = Array.from({ length: 20 }, (_, i) => ({ PutRequest: { Item: { [LOCK_KEY]: { S: ticketKey('http', i + 1) }, t: { S: token } } } }));
      await sim.db.call('BatchWriteItem', { RequestItems: { [table]: [...tickets, { PutRequest: { Item: lockItem('batch', 1, 1) } }] } });
      const samplesThen = monitor.samples;
      await until(() => monitor.samples >= samplesThen + 15, 'three more samples of the five locks');
      await monitor.stop();

      expect([...read].sort()).toEqual(['again', 'batch', 'before', 'http', 'transaction']);
      expect(monitor.violations).toEqual(
        expect.arrayContaining(['again: 0 permits in use but 1 holders', 'http: 2 permits in use for 1 holders', 'transaction: 3 permits in use, limit 2']),
      );
      expect(monitor.violations.filter((v) => v.startsWith('before') || v.startsWith('batch') || v.includes(TICKET_KEY_SEPARATOR))).toEqual([]);
      expect(monitor.permitsInUse).toBe(7);
      expect(monitor.maxPermits).toBe(3);
      // The largest lock item (three holders), not a 3 KB ticket item.
      expect(monitor.maxItemBytes).toBeGreaterThan(100);
      expect(monitor.maxItemBytes).toBeLessThan(300);
    } finally {
      await sim.stop();
    }
  });
});

describe('the inside tracker', () => {
  test('counts the most inside at once at the times the states were entered, not in the order the simulator read them', () => {
    type Listener = (execution: { arn: string }, stateName: string, enteredAt: number) => void;
    const listeners: Listener[] = [];
    const fake = { onStateEntered: (l: Listener) => listeners.push(l), onExecutionStopped: () => undefined, now: () => 0 };
    const tracker = new InsideTracker(fake as unknown as Simulator, ['Enter'], ['Leave'], (e) => (e.arn === 'b' ? 3 : 1));
    const entered = (arn: string, stateName: string, at: number) => listeners.forEach((l) => l({ arn }, stateName, at));
    // Read in this order: a in at 0; b in at 11 (its lock read after a's release); a's way out at 10, read late.
    entered('a', 'Enter', 0);
    entered('b', 'Enter', 11);
    expect(tracker.inside).toBe(2);
    entered('a', 'Leave', 10);
    // Never two inside: a left before b entered.
    expect([tracker.maxInside, tracker.maxPermitsInside]).toEqual([1, 3]);
    // c enters while b is inside: two, holding 4 permits.
    entered('c', 'Enter', 12);
    entered('c', 'Leave', 20);
    expect([tracker.maxInside, tracker.maxPermitsInside]).toEqual([2, 4]);
  });
});
