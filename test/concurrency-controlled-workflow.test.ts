import { createHash } from 'crypto';
import { App, CfnParameter, Duration, RemovalPolicy, Stack } from 'aws-cdk-lib';
import { Annotations, Match, Template } from 'aws-cdk-lib/assertions';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as kms from 'aws-cdk-lib/aws-kms';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { ConcurrencyControlledWorkflow, ConcurrencyControlledWorkflowProps, IdempotencyKey, IdempotentWorkflow, RateLimit, SemaphoreReconciler, SemaphoreTable, WaitStrategy } from '../src';
import { logicalId } from './helpers';
import { HOLDER_OWNER } from '../client/semaphore-client';
import { itemSizeBytes } from '../simulator/dynamodb';
import {
  ACQUIRE_CONDITION,
  executionArnOfHolder,
  executionHolderKey,
  executionHolderKeyOfArn,
  HOLDER_ACQUIRED_AT,
  HOLDER_CLAIMED,
  HOLDER_COLLECTING,
  HOLDER_EXTRA_PERMITS,
  HOLDER_FENCING_TOKEN,
  HOLDER_HANDOFF_ID,
  HOLDER_IN_BODY,
  HOLDER_LEASE_EXPIRES_AT,
  HOLDER_LEASE_SECONDS,
  HOLDER_PERMITS,
  HOLDER_REDRIVE_COUNT,
  isExecutionHolder,
  LOCK_KEY,
  MAX_CONCURRENCY_LIMIT,
  MAX_HOLDER_ENTRY_BYTES,
  MAX_OWNER_LENGTH,
  MAX_PERMITS,
  RELEASE_IF_NO_WAITERS_CONDITION,
  RELEASE_UPDATE,
  TAKE_TICKET_CONDITION,
} from '../src/private/lock-schema';

/** How a workflow's states name its own holder id: the MD5 of its state machine's (unqualified) ARN, ':', its execution's name. */
const OWN_HOLDER_ID =
  "States.Format('{}:{}', States.Hash(States.Format('arn:{}:states:{}:{}:stateMachine:{}', " +
  "States.ArrayGetItem(States.StringSplit($$.StateMachine.Id, ':'), 1), States.ArrayGetItem(States.StringSplit($$.StateMachine.Id, ':'), 3), " +
  "States.ArrayGetItem(States.StringSplit($$.StateMachine.Id, ':'), 4), $$.StateMachine.Name), 'MD5'), $$.Execution.Name)";

function newStack() {
  return new Stack(new App(), 'Stack');
}

function workflow(props: Partial<ConcurrencyControlledWorkflowProps> = {}, stack = newStack()) {
  const w = new ConcurrencyControlledWorkflow(stack, 'Workflow', { body: new sfn.Pass(stack, 'Work'), ...props });
  return {
    stack,
    workflow: w,
    // Synthesis is cached per app: only synthesize once the test has added everything.
    get template() {
      return Template.fromStack(stack);
    },
  };
}

/** The state machine definition as JSON, with tokens of the stack left as CloudFormation. */
function definitionOf(stack: Stack, sm: sfn.StateMachine): any {
  const cfn = Template.fromStack(stack).toJSON().Resources[logicalId(sm.node.defaultChild as any)];
  const parts: any[] = cfn.Properties.DefinitionString['Fn::Join'][1];
  return JSON.parse(parts.map((p) => (typeof p === 'string' ? p : JSON.stringify(p).replace(/"/g, "'"))).join(''));
}

/** Statements of the default policy of a role, found by the role's logical ID prefix. */
function policyStatements(template: Template, rolePrefix: string): any[] {
  const policies = template.findResources('AWS::IAM::Policy');
  return Object.values(policies)
    .filter((p: any) => p.Properties.Roles.some((r: any) => r.Ref.startsWith(rolePrefix)))
    .flatMap((p: any) => p.Properties.PolicyDocument.Statement);
}

describe('resources', () => {
  test('creates a table, a Standard state machine, its log group and the cleanup', () => {
    const { template, workflow: w, stack } = workflow();

    template.resourceCountIs('AWS::DynamoDB::Table', 1);
    template.resourceCountIs('AWS::StepFunctions::StateMachine', 2);
    template.hasResourceProperties('AWS::StepFunctions::StateMachine', {
      StateMachineType: 'STANDARD',
      TracingConfiguration: { Enabled: true },
      LoggingConfiguration: { Level: 'ALL', IncludeExecutionData: false },
    });
    template.resourceCountIs('AWS::Events::Rule', 3); // the cleanup's, the reconciler's schedule and the redrive guard's
    expect(w.table).toBeInstanceOf(SemaphoreTable);
    expect(w.cleanupStateMachine).toBe(w.cleanup.stateMachine);
    expect(w.cleanupRule).toBe(w.cleanup.rule);
    expect(w.lockName).toBe('Stack/Workflow');
    expect(stack.resolve(w.stateMachine.stateMachineArn)).toEqual({ Ref: logicalId(w.stateMachine.node.defaultChild as any) });
  });

  test('uses a given table and creates none', () => {
    const stack = newStack();
    const table = SemaphoreTable.fromTableName(stack, 'Locks', 'shared-locks');

    const { template, workflow: w } = workflow({ table }, stack);

    template.resourceCountIs('AWS::DynamoDB::Table', 0);
    expect(w.table).toBe(table);
  });

  test('passes name, timeout, logs, tracing, role, removal policy and comment through', () => {
    const stack = newStack();
    const logGroup = new logs.LogGroup(stack, 'Logs');
    const role = new iam.Role(stack, 'MyRole', { assumedBy: new iam.ServicePrincipal('states.amazonaws.com') });

    const { template, workflow: w } = workflow(
      {
        stateMachineName: 'guarded',
        timeout: Duration.minutes(30),
        logs: { destination: logGroup, level: sfn.LogLevel.ERROR },
        tracingEnabled: false,
        role,
        removalPolicy: RemovalPolicy.RETAIN,
        comment: 'my comment',
      },
      stack,
    );

    template.hasResource('AWS::StepFunctions::StateMachine', {
      Properties: {
        StateMachineName: 'guarded',
        RoleArn: { 'Fn::GetAtt': [Match.stringLikeRegexp('^MyRole'), 'Arn'] },
        LoggingConfiguration: { Level: 'ERROR' },
        TracingConfiguration: { Enabled: false },
      },
      DeletionPolicy: 'Retain',
    });
    expect(definitionOf(stack, w.stateMachine)).toMatchObject({ Comment: 'my comment', TimeoutSeconds: 1800 });
    // No default log group was made beside the given one: the given one, the cleanup's, the reconciler's.
    template.resourceCountIs('AWS::Logs::LogGroup', 3);
    expect(w.logGroup).toBe(logGroup);
  });
});

describe('definition', () => {
  test('acquires with one conditional UpdateItem, runs the body in a Parallel and releases', () => {
    const { stack, workflow: w } = workflow({ concurrencyLimit: 3, lockName: 'db-migrations', waitStrategy: WaitStrategy.POLLING });
    const def = definitionOf(stack, w.stateMachine);

    expect(def.StartAt).toBe('Acquire Permit');
    const acquire = def.States['Acquire Permit'];
    expect(acquire).toMatchObject({
      Type: 'Task',
      Resource: expect.stringContaining(':states:::dynamodb:updateItem'),
      ResultPath: null,
      Next: 'Run Protected Body',
      Parameters: {
        Key: { lockName: { S: 'db-migrations' } },
        // Its own entry lets the condition through and fails the update (a number plus a map): see ACQUIRE_CONDITION.
        ConditionExpression: ACQUIRE_CONDITION,
        UpdateExpression: 'SET #permits = if_not_exists(#permits, :zero) + :one, #holder = :entry, #limit = :limit, #fence = if_not_exists(#fence, :zero) + if_not_exists(#holder, :one)',
        ExpressionAttributeNames: { '#permits': 'permitsInUse', '#holder.$': OWN_HOLDER_ID, '#limit': 'concurrencyLimit', '#fence': 'fencingToken' },
        ExpressionAttributeValues: {
          ':limit': { N: '3' },
          ':entry': { M: { a: { 'S.$': '$$.State.EnteredTime' } } },
        },
      },
    });
    // The full lock is not an error: it is caught and sent to the wait, never retried.
    expect(acquire.Retry.flatMap((r: any) => r.ErrorEquals)).not.toContain('DynamoDB.ConditionalCheckFailedException');
    expect(acquire.Retry[0]).toMatchObject({
      ErrorEquals: expect.arrayContaining(['DynamoDB.ProvisionedThroughputExceededException']),
      JitterStrategy: 'FULL',
      MaxDelaySeconds: 8,
      MaxAttempts: 40,
    });
    expect(acquire.Catch).toEqual([
      { ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], ResultPath: null, Next: 'Wait For Permit' },
      { ErrorEquals: ['DynamoDB.AmazonDynamoDBException'], ResultPath: null, Next: 'Claim Own Permit' },
    ]);
    // An uncertain acquire is retried: if the first write landed, the retry finds the entry and claims it.
    expect(acquire.Retry[0].ErrorEquals).toContain('DynamoDB.InternalServerErrorException');
    expect(def.States['Claim Own Permit']).toMatchObject({
      Next: 'Run Protected Body',
      Parameters: {
        ConditionExpression: 'attribute_exists(#holder) AND (attribute_not_exists(#holder.r) OR #holder.r <= :redriveCount)',
        UpdateExpression: 'SET #fence = if_not_exists(#fence, :zero) + :one, #holder.c = :claimed, #holder.a = :acquiredAt, #holder.r = :redriveCount',
      },
      Catch: [{ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], ResultPath: null, Next: 'Wait For Permit' }, expect.anything()],
    });
    // The body's output and the release's holder in one object, without a state of their own.
    expect(def.States['Run Protected Body']).toMatchObject({
      Type: 'Parallel',
      ResultSelector: { 'output.$': '$[0]', 'handoff': { 'holder.$': OWN_HOLDER_ID, 'redriveCount.$': '$$.Execution.RedriveCount' } },
      Next: 'Release Permit',
      Catch: [{ ErrorEquals: ['States.ALL'], ResultPath: '$', Next: 'Prepare Release After Failure' }],
    });
    expect(def.States['Run Protected Body'].Branches[0].StartAt).toBe('Work');
    // Nobody waiting: one conditional write gives the permit back and ends the execution with the body's output.
    expect(def.States['Release Permit']).toMatchObject({
      OutputPath: '$.output',
      End: true,
      Catch: [{ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], ResultPath: null, Next: 'Peek At Next Waiter' }],
    });
    expect(def.States['Release Permit'].Parameters).toMatchObject({
      // No ticket waiting: the lock item's two counters say so.
      ConditionExpression: expect.stringContaining('AND ((attribute_not_exists(#tail) OR #head >= #tail) OR '),
      UpdateExpression: RELEASE_UPDATE,
      ExpressionAttributeNames: { '#holder.$': '$.handoff.holder', '#tail': 'queueTail', '#head': 'queueHead' },
    });
    // Waiters: the releaser claims the next ticket (head + 1) while it still holds the permit.
    expect(def.States['Peek At Next Waiter']).toMatchObject({
      Next: 'Serve Ticket',
      ResultPath: '$.handoff.next',
      Parameters: { UpdateExpression: 'SET #head = #head + :one', ConditionExpression: expect.stringContaining('AND #head < #tail'), ReturnValues: 'UPDATED_NEW' },
      ResultSelector: { 'ticket.$': 'States.StringToJson($.Attributes.queueHead.N)' },
    });
    // Its ticket item (key: lock name, unit separator, ticket) is served by deleting it, which returns the waiter and its token.
    const ticketKey = { 'S.$': "States.Format('{}\u001f{}', 'db-migrations', $.handoff.next.ticket)" };
    // Only a ticket with a waiter is served: success leads straight to the hand-off.
    expect(def.States['Serve Ticket']).toMatchObject({
      Resource: expect.stringContaining(':states:::dynamodb:deleteItem'),
      Next: 'Hand Off Permit',
      ResultPath: '$.handoff.ticket',
      Parameters: {
        Key: { lockName: ticketKey },
        ConditionExpression: 'attribute_not_exists(#servedBy) AND attribute_exists(#waiter)',
        ExpressionAttributeNames: { '#servedBy': 's', '#waiter': 'w' },
        ReturnValues: 'ALL_OLD',
      },
      Catch: [{ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], ResultPath: null, Next: 'Mark Ticket Served' }],
    });
    // Refused (no waiter yet, or served already): mark it anyway, which refuses a waiter still on its way, or read it.
    expect(def.States['Mark Ticket Served']).toMatchObject({
      Next: 'Check Ticket',
      ResultPath: '$.handoff.ticket',
      Parameters: { Key: { lockName: ticketKey }, UpdateExpression: 'SET #servedBy = :servedBy', ConditionExpression: 'attribute_not_exists(#servedBy)', ReturnValues: 'ALL_NEW' },
      Catch: [{ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], ResultPath: null, Next: 'Read Served Ticket' }],
    });
    expect(def.States['Read Served Ticket']).toMatchObject({
      Next: 'Check Ticket',
      Resource: expect.stringContaining(':states:::dynamodb:getItem'),
      Parameters: { Key: { lockName: ticketKey }, ConsistentRead: true },
    });
    // A ticket without a waiter (skipped) sends the releaser to the next one.
    expect(def.States['Check Ticket']).toEqual({
      Type: 'Choice',
      Choices: [{ Variable: '$.handoff.ticket.Item.w', IsPresent: true, Next: 'Hand Off Permit' }],
      Default: 'Peek At Next Waiter',
    });
    expect(def.States['Hand Off Permit']).toMatchObject({
      Parameters: {
        Key: { lockName: { S: 'db-migrations' } },
        // The hand-off draws the waiter's fencing token itself: tokens follow the order permits are granted in.
        // (It gives back a weighted entry's extra permits: the waiter takes one.)
        UpdateExpression: 'SET #next = :entry, #fence = #fence + :one, #permits = #permits - if_not_exists(#holder.x, :zero), #bodies = if_not_exists(#bodies, :zero) - if_not_exists(#holder.b, :zero) REMOVE #holder',
        ConditionExpression: expect.stringContaining('AND attribute_not_exists(#next)'),
        ExpressionAttributeNames: { '#next.$': '$.handoff.ticket.Item.w.S' },
        ReturnValues: 'UPDATED_OLD',
      },
      // Its fencing token is the counter before the update, plus one.
      ResultSelector: { 'fencingToken.$': 'States.MathAdd(States.StringToJson($.Attributes.fencingToken.N), 1)' },
      ResultPath: '$.handoff.wake',
    });
    // The hand-off id names the ticket it claimed and the releaser's run: a redriven releaser never takes back a permit its stopped run handed over.
    expect(def.States['Hand Off Permit'].Parameters.ExpressionAttributeValues[':entry'].M.h).toEqual({
      'S.$': "States.Format('{}/{}', $.handoff.next.ticket, $$.Execution.RedriveCount)",
    });
    expect(def.States['Wake Next Waiter'].Parameters['Output.$']).toBe('States.JsonToString($.handoff.wake)');
    expect(def.States['Wake Next Waiter'].Parameters['TaskToken.$']).toBe('$.handoff.ticket.Item.t.S');
    // The wake-up is the hand-off's last call (the ticket's item went when it was served): it ends the execution.
    expect(def.States['Wake Next Waiter']).toMatchObject({
      Resource: expect.stringContaining(':states:::aws-sdk:sfn:sendTaskSuccess'),
      OutputPath: '$.output',
      End: true,
      Catch: [
        { ErrorEquals: ['Sfn.TaskTimedOutException', 'Sfn.TaskDoesNotExistException', 'Sfn.InvalidTokenException'], ResultPath: null, Next: 'Take Back Permit' },
        { ErrorEquals: ['Sfn.SfnException', 'Sfn.ThrottlingException'], ResultPath: null, Next: 'Is Waiter Still Waiting' },
        { ErrorEquals: ['States.ALL'], ResultPath: null, Next: 'Wake-Up Lost' },
      ],
    });
    // Never retried: a retried call that did wake the waiter would hear TaskTimedOut and take the permit back.
    // Throttled (Sfn.SfnException), a heartbeat tells whether the waiter still waits; only then is it woken again,
    // and that second call's failure, whatever it is, is a lost wake-up (never a take-back).
    expect(def.States['Wake Next Waiter'].Retry).toBeUndefined();
    expect(def.States['Is Waiter Still Waiting']).toMatchObject({
      Resource: expect.stringContaining(':states:::aws-sdk:sfn:sendTaskHeartbeat'),
      Parameters: { 'TaskToken.$': '$.handoff.ticket.Item.t.S' },
      Next: 'Wake Next Waiter Again',
      Catch: [{ ErrorEquals: ['States.ALL'], ResultPath: null, Next: 'Wake-Up Lost' }],
    });
    expect(def.States['Wake Next Waiter Again']).toMatchObject({
      OutputPath: '$.output',
      End: true,
      Catch: [{ ErrorEquals: ['States.ALL'], ResultPath: null, Next: 'Wake-Up Lost' }],
    });
    expect(def.States['Wake Next Waiter Again'].Retry).toBeUndefined();
    expect(def.States['Delete Served Ticket']).toBeUndefined();
    // A hand-off hidden by a server error, confirmed by its id, is woken; one refused goes to the next ticket.
    expect(def.States['Hand Off Permit'].Catch).toEqual([
      { ErrorEquals: ['DynamoDB.ConditionalCheckFailedException', 'DynamoDB.AmazonDynamoDBException'], ResultPath: null, Next: 'Peek At Next Waiter' },
      { ErrorEquals: ['DynamoDB.InternalServerErrorException'], ResultPath: null, Next: 'Confirm Hand-Off' },
    ]);
    expect(def.States['Confirm Hand-Off'].Next).toBe('Wake Next Waiter');
    // Confirm and take back know the hand-off by its id.
    expect(def.States['Confirm Hand-Off'].Parameters.ConditionExpression).toBe('#next.h = :handoffId');
    expect(def.States['Take Back Permit'].Parameters.ConditionExpression).toContain('#next.h = :handoffId');
    // No write anywhere changes two items at once.
    expect(JSON.stringify(def)).not.toContain('transactWriteItems');
    expect(def.States['Fail With Original Error']).toEqual({ Type: 'Fail', ErrorPath: '$.Error', CausePath: '$.Cause' });
  });

  test('polling: waits a jittered first delay, then polls every pollInterval', () => {
    const { stack, workflow: w } = workflow({ pollInterval: Duration.seconds(7), waitStrategy: WaitStrategy.POLLING });
    const branch = definitionOf(stack, w.stateMachine).States['Wait For Permit'].Branches[0];

    expect(branch.States['Draw Poll Delay'].Parameters).toEqual({ 'delaySeconds.$': 'States.MathRandom(1, 8)' });
    expect(branch.States['Wait Before First Poll']).toMatchObject({ SecondsPath: '$.delaySeconds', Next: 'Poll For Permit' });
    expect(branch.States['Wait Before Next Poll']).toMatchObject({ Seconds: 7, Next: 'Poll For Permit' });
    expect(branch.States['Poll For Permit'].Next).toBe('Permit Acquired');
    // Every poll waits pollInterval, so a timer bounds the rounds: 2,568 polls of 7 events fit in the
    // 18,000 history events of the wait (Step Functions fails an execution at 25,000).
    const timer = definitionOf(stack, w.stateMachine).States['Wait For Permit'].Branches[1];
    expect(timer.States['Wait Until Acquire Timeout']).toMatchObject({ Type: 'Wait', Seconds: 2568 * 7, Next: 'Acquire Timed Out' });
    expect(w.longestWait?.toSeconds()).toBe(2568 * 7);
  });

  test('queue: takes a ticket while the lock is full, waits on its ticket item with its task token, and checks for a lost wake-up after queueCheckInterval', () => {
    const props = { waitStrategy: WaitStrategy.QUEUE, queueCheckInterval: Duration.minutes(2), leaseDuration: Duration.minutes(30), lockName: 'jobs' };
    const { stack, workflow: w } = workflow(props);
    const def = definitionOf(stack, w.stateMachine);
    // The first wait runs outside the Wait For Permit Parallel: the ticket replaces the state data (the
    // execution's input here), and a wake-up goes to the body with the execution's input, from the context.
    expect(def.States['Acquire Permit'].Catch[0]).toMatchObject({ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], Next: 'Take Ticket' });
    expect(def.States['Claim Own Permit'].Catch[0]).toMatchObject({ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], Next: 'Take Ticket' });
    const takeTicket = {
      Parameters: {
        Key: { lockName: { S: 'jobs' } },
        UpdateExpression: 'SET #tail = if_not_exists(#tail, :zero) + :one, #head = if_not_exists(#head, :zero)',
        ConditionExpression: TAKE_TICKET_CONDITION,
        ReturnValues: 'UPDATED_NEW',
      },
    };
    // The ticket: the lock item's tail, one more, only while the lock is full and the execution holds nothing.
    expect(def.States['Take Ticket']).toMatchObject({
      ...takeTicket,
      Next: 'Wait In Queue',
      ResultPath: '$',
      ResultSelector: { 'ticket.$': 'States.StringToJson($.Attributes.queueTail.N)' },
      // Refused: a permit is free (or the execution holds one): the Parallel polls. Its error is the
      // state data the Parallel gets (the input need not be an object). Any other error: the release after failure.
      Catch: [
        { ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], ResultPath: '$', Next: 'Wait For Permit' },
        { ErrorEquals: ['States.ALL'], ResultPath: '$', Next: 'Prepare Release After Failure' },
      ],
    });
    const wait = def.States['Wait In Queue'];
    expect(wait).toMatchObject({
      Resource: expect.stringContaining(':states:::aws-sdk:dynamodb:updateItem.waitForTaskToken'),
      TimeoutSeconds: 120,
      ResultPath: null,
      OutputPath: '$$.Execution.Input',
      Next: 'Run Protected Body',
      Parameters: {
        Key: { lockName: { 'S.$': "States.Format('{}\u001f{}', 'jobs', $.ticket)" } },
        UpdateExpression: 'SET #waiter = :me, #run = :redriveCount, #lease = :lease, #limit = :limit, #token = :token',
        // A ticket skipped while its waiter was on its way has an item marked served: refused.
        ConditionExpression: 'attribute_not_exists(#servedBy) AND attribute_not_exists(#waiter)',
        ExpressionAttributeValues: {
          ':me': { 'S.$': OWN_HOLDER_ID },
          ':redriveCount': { 'N.$': 'States.JsonToString($$.Execution.RedriveCount)' },
          ':lease': { N: '1800' },
          ':limit': { N: '1' }, // its own limit, for the reconciler's admissions
          ':token': { 'S.$': '$$.Task.Token' },
        },
      },
    });
    // Every other end (timed out; refused or uncertain) enters the Parallel with its error beside its ticket.
    expect(wait.Catch).toEqual([
      { ErrorEquals: ['States.Timeout'], ResultPath: '$.timedOut', Next: 'Wait For Permit' },
      { ErrorEquals: ['DynamoDb.ConditionalCheckFailedException', 'DynamoDb.InternalServerErrorException'], ResultPath: '$.refused', Next: 'Wait For Permit' },
      { ErrorEquals: ['States.ALL'], ResultPath: '$', Next: 'Prepare Release After Failure' },
    ]);
    // The Parallel keeps the ticket (or the refused ticket's error) in its own state data, and leaves the
    // execution's input to the body.
    expect(def.States['Wait For Permit']).toMatchObject({
      Type: 'Parallel',
      Parameters: { 'semaphoreWait': { events: 0 }, 'semaphoreTicket.$': '$' },
      ResultPath: null,
      OutputPath: '$$.Execution.Input',
      Next: 'Run Protected Body',
    });
    const branch = def.States['Wait For Permit'].Branches[0];
    expect(branch.StartAt).toBe('Resume Wait');
    const states = branch.States;
    // It goes on where the branch would have.
    expect(states['Resume Wait']).toEqual({
      Type: 'Choice',
      Choices: [
        // Timed out: poll once (the check for a lost wake-up), then sleep again on the same ticket.
        { Variable: '$.semaphoreTicket.timedOut', IsPresent: true, Next: 'Poll For Permit Again' },
        // Refused, or uncertain: look for a handed-off permit, then try to take a free one.
        { Variable: '$.semaphoreTicket.refused', IsPresent: true, Next: 'Check Handed-Off Permit' },
      ],
      // The ticket refused: a permit is free (or the execution holds one, which the acquire tells).
      Default: 'Poll For Permit',
    });
    expect(states['Check Handed-Off Permit'].Catch[0]).toMatchObject({ Next: 'Poll For Permit' });
    // New tickets, in the branch, as the first.
    expect(states['Take New Ticket']).toMatchObject({
      ...takeTicket,
      Next: 'Wait In Queue On New Ticket',
      ResultPath: '$.semaphoreTicket',
      ResultSelector: { 'ticket.$': 'States.StringToJson($.Attributes.queueTail.N)' },
      Catch: [{ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], ResultPath: null, Next: 'Poll For Permit' }],
    });
    expect(states['Wait In Queue On New Ticket']).toMatchObject({
      Parameters: {
        ...wait.Parameters,
        Key: { lockName: { 'S.$': "States.Format('{}\u001f{}', 'jobs', $.semaphoreTicket.ticket)" } },
      },
      End: true,
    });
    expect(states['Wait In Queue On New Ticket'].Catch).toEqual([
      { ErrorEquals: ['States.Timeout'], ResultPath: null, Next: 'Poll For Permit Again' },
      { ErrorEquals: ['DynamoDb.ConditionalCheckFailedException', 'DynamoDb.InternalServerErrorException'], ResultPath: null, Next: 'Check Handed-Off Permit' },
    ]);
    // Still full: a new ticket, after counting the round against the history budget.
    expect(states['Poll For Permit'].Catch[0]).toMatchObject({ Next: 'Count Queue Retry' });
    expect(states['Count Queue Retry']).toMatchObject({
      Parameters: { 'events.$': 'States.MathAdd($.semaphoreWait.events, 32)' },
      ResultPath: '$.semaphoreWait',
      Next: 'Queue Retry Within Budget?',
    });
    expect(states['Queue Retry Within Budget?']).toMatchObject({
      Choices: [{ Variable: '$.semaphoreWait.events', NumericGreaterThan: 17980, Next: 'Wait Budget Spent' }],
      Default: 'Take New Ticket',
    });
    expect(states['Wait Budget Spent']).toMatchObject({ Type: 'Fail', Error: 'SemaphoreAcquireTimeout' });
    expect(states['Poll For Permit Again'].Catch[0]).toMatchObject({ Next: 'Count Queue Check' });
    expect(states['Count Queue Check'].Parameters).toEqual({ 'events.$': 'States.MathAdd($.semaphoreWait.events, 15)' });
    expect(states['Queue Check Within Budget?']).toMatchObject({
      Choices: [{ Variable: '$.semaphoreWait.events', NumericGreaterThan: 17980, Next: 'Wait Budget Spent' }],
      Default: 'Wait In Queue Again',
    });
    // The count starts at 0 in the branch's own data (above); 1,198 checks of 2 minutes fit.
    expect(w.longestWait?.toSeconds()).toBe(1198 * 120);
    // The acquire of a waiter finds a permit handed to it through the validation error (see ACQUIRE_CONDITION).
    for (const name of ['Poll For Permit', 'Poll For Permit Again']) {
      expect(states[name].Catch[1]).toMatchObject({ ErrorEquals: ['DynamoDB.AmazonDynamoDBException'], Next: 'Check Handed-Off Permit Again' });
    }
    const again = states['Wait In Queue Again'];
    expect(again).toMatchObject({
      Resource: expect.stringContaining(':states:::aws-sdk:dynamodb:updateItem.waitForTaskToken'),
      TimeoutSeconds: 120,
      End: true,
      Parameters: {
        UpdateExpression: wait.Parameters.UpdateExpression,
        // Only the ticket item this run wrote, not served yet: a redriven run never waits on its stopped run's ticket.
        ConditionExpression: 'attribute_not_exists(#servedBy) AND #waiter = :me AND #run = :redriveCount',
      },
    });
    // Timed out again: poll again; one wait, one poll and one write per check interval.
    expect(again.Catch[0]).toMatchObject({ ErrorEquals: ['States.Timeout'], Next: 'Poll For Permit Again' });
    // Refused: served (a lost wake-up: the permit is its), or its ticket is gone.
    expect(again.Catch[1]).toMatchObject({ ErrorEquals: ['DynamoDb.ConditionalCheckFailedException'], Next: 'Check Handed-Off Permit Again' });
    expect(states['Check Handed-Off Permit Again']).toMatchObject({ End: true, Catch: [{ Next: 'Wait Before Next Poll' }] });
    expect(again.Catch[2]).toMatchObject({ ErrorEquals: ['DynamoDb.InternalServerErrorException'], Next: 'Check Handed-Off Permit' });
    expect(states['Wait Before Next Poll'].Next).toBe('Count Queue Retry');
  });

  test('queue: the first wait stays in the Parallel where something else rides through the wait, or the state data holds the input', () => {
    const cases: Array<[string, Partial<ConcurrencyControlledWorkflowProps>]> = [
      ['an acquire timeout', { acquireTimeout: Duration.minutes(5) }],
      ['fencing tokens', { permitPath: '$.permit' }],
      ['a weight', { concurrencyLimit: 4, permits: 2 }],
      ['a rate', { rateLimit: RateLimit.perSecond(5) }],
      // Their state data holds the input: the ticket beside it would take room an input close to the quota has not got.
      ['a split lock', { concurrencyLimit: 4, lockStripes: 2 }],
      ['idempotency', { idempotency: { key: IdempotencyKey.fromFields('$.id') } }],
    ];
    for (const [what, props] of cases) {
      const { stack, workflow: w } = workflow({ waitStrategy: WaitStrategy.QUEUE, ...props });
      const def = definitionOf(stack, w.stateMachine);
      const states = JSON.stringify(def);
      expect([what, states.includes('"Resume Wait"'), states.includes('"Take New Ticket"')]).toEqual([what, false, false]);
      const branch = JSON.stringify(def).match(/"Wait For Permit":\{"Type":"Parallel"/);
      expect([what, branch !== null]).toEqual([what, true]);
    }
  });

  test('rejects a permitPath that is not a field path', () => {
    expect(() => workflow({ permitPath: 'permit' })).toThrow(/`permitPath` must be a JSONPath of a field .* got: 'permit'/);
    expect(() => workflow({ permitPath: '$' })).toThrow(/`permitPath`/);
  });

  test('reads a runtime lock name and limit from the execution input', () => {
    const { stack, workflow: w } = workflow({
      lockName: sfn.JsonPath.stringAt('$.tenant'),
      concurrencyLimit: sfn.JsonPath.numberAt('$.settings.limit'),
    });
    const def = definitionOf(stack, w.stateMachine);

    expect(def.States['Acquire Permit'].Parameters.Key).toEqual({ lockName: { 'S.$': '$$.Execution.Input.tenant' } });
    expect(def.States['Acquire Permit'].Parameters.ExpressionAttributeValues[':limit']).toEqual({
      'N.$': "States.Format('{}', $$.Execution.Input.settings.limit)",
    });
    // After the body the state data is the body's output, so the release must read the context too.
    expect(def.States['Release Permit'].Parameters.Key).toEqual({ lockName: { 'S.$': '$$.Execution.Input.tenant' } });
    // A runtime lock name, then a runtime limit, are checked once, before the first acquire.
    expect(def.StartAt).toBe('Check Runtime Lock Name');
    expect(def.States['Check Runtime Lock Name']).toMatchObject({ Type: 'Choice', Default: 'Check Runtime Limit' });
    expect(def.States['Check Runtime Lock Name'].Choices).toContainEqual({ Variable: '$.tenant', StringMatches: '*\u001f*', Next: 'Runtime Lock Name Invalid' });
    expect(def.States['Runtime Lock Name Invalid']).toMatchObject({ Type: 'Fail', Error: 'SemaphoreInvalidLockName' });
    expect(def.States['Check Runtime Limit']).toMatchObject({ Type: 'Choice', Default: 'Acquire Permit' });
    expect(def.States['Runtime Limit Invalid']).toMatchObject({ Type: 'Fail', Error: 'SemaphoreInvalidLimit' });
  });

  test('with an acquire timeout, races the poll against a timer', () => {
    const { stack, workflow: w } = workflow({ acquireTimeout: Duration.minutes(2), waitStrategy: WaitStrategy.POLLING });
    const wait = definitionOf(stack, w.stateMachine).States['Wait For Permit'];

    expect(wait.Branches).toHaveLength(2);
    expect(wait.Branches[0].StartAt).toBe('Draw Poll Delay');
    expect(wait.Branches[1].States['Wait Until Acquire Timeout']).toMatchObject({ Seconds: 120 });
    expect(wait.Branches[1].States['Acquire Timed Out']).toMatchObject({ Type: 'Fail', Error: 'SemaphoreAcquireTimeout' });
    expect(wait.Catch[0]).toEqual({ ErrorEquals: ['SemaphorePermitAcquired'], ResultPath: null, Next: 'Run Protected Body' });
  });

  test('warns when the acquire timeout is not shorter than the execution timeout', () => {
    const { stack } = workflow({ acquireTimeout: Duration.minutes(10), timeout: Duration.minutes(5) });
    Annotations.fromStack(stack).hasWarning('/Stack/Workflow', Match.stringLikeRegexp('acquireTimeout \\(10 minutes\\) is not shorter'));
  });
});

describe('cleanup', () => {
  test('a rule on stopped executions of this state machine starts the cleanup, with retries and an encrypted DLQ', () => {
    const { template, workflow: w } = workflow();
    const smId = logicalId(w.stateMachine.node.defaultChild as any);

    template.hasResourceProperties('AWS::Events::Rule', {
      EventPattern: {
        'source': ['aws.states'],
        'detail-type': ['Step Functions Execution Status Change'],
        'detail': { status: ['FAILED', 'TIMED_OUT', 'ABORTED'], stateMachineArn: [{ Ref: smId }] },
      },
      Targets: [
        Match.objectLike({
          Arn: { Ref: Match.stringLikeRegexp('^WorkflowCleanupStateMachine') },
          RetryPolicy: { MaximumRetryAttempts: 185, MaximumEventAgeInSeconds: 86400 },
          DeadLetterConfig: { Arn: { 'Fn::GetAtt': [Match.stringLikeRegexp('^WorkflowCleanupDeadLetterQueue'), 'Arn'] } },
        }),
      ],
    });
    template.hasResourceProperties('AWS::SQS::Queue', { SqsManagedSseEnabled: true, MessageRetentionPeriod: 1209600 });
  });

  test('frees the permit of the stopped execution with one conditional write', () => {
    const { stack, workflow: w } = workflow({ lockName: 'fixed' });
    const def = definitionOf(stack, w.cleanupStateMachine);

    // First, the event's checks (executed in workflow-simulation.test.ts): a stopped status, a redrive count.
    expect(def.StartAt).toBe('Stopped Execution?');
    expect(def.States['Stopped Execution?'].Default).toBe('Prepare Release Of Stopped Execution');
    expect(def.States['Prepare Release Of Stopped Execution']).toMatchObject({
      // The holder id: the MD5 of the state machine's ARN, and the execution's name, the eighth field of its ARN.
      Parameters: {
        'holder.$': "States.Format('{}:{}', States.Hash($.detail.stateMachineArn, 'MD5'), States.ArrayGetItem(States.StringSplit($.detail.executionArn, ':'), 7))",
        'redriveCount.$': '$.detail.redriveCount',
      },
      ResultPath: '$.handoff',
      Next: 'Release Permit Of Stopped Execution',
    });
    expect(def.States['Release Permit Of Stopped Execution']).toMatchObject({
      Parameters: {
        Key: { lockName: { S: 'fixed' } },
        // Only a permit taken by the run that stopped (or an earlier one), not by a later redrive; and
        // only while nobody waits (else it is handed to the oldest waiter).
        ConditionExpression: RELEASE_IF_NO_WAITERS_CONDITION,
        ExpressionAttributeNames: { '#holder.$': '$.handoff.holder' },
        ExpressionAttributeValues: { ':one': { N: '1' }, ':redriveCount': { 'N.$': 'States.JsonToString($.handoff.redriveCount)' } },
      },
      Catch: [{ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], Next: 'Peek At Next Waiter Of Stopped Execution', ResultPath: null }],
    });
    // After a peek that found no waiter: still only if nobody waits; refused, is it still held (look at the queue again) or not.
    expect(def.States['Release Permit Without Hand-Off Of Stopped Execution']).toMatchObject({
      Parameters: { ConditionExpression: expect.stringContaining('(attribute_not_exists(#tail) OR #head >= #tail)') },
      Catch: [{ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], Next: 'Is Permit Still Held Of Stopped Execution', ResultPath: null }],
    });
    expect(def.States['Is Permit Still Held Of Stopped Execution']).toMatchObject({
      Next: 'Peek At Next Waiter Of Stopped Execution',
      Catch: [{ ErrorEquals: ['DynamoDB.ConditionalCheckFailedException'], Next: 'Permit Not Held', ResultPath: null }],
    });
  });

  test('reads a runtime lock name from the event, or from DescribeExecution when the input is not in it', () => {
    const { stack, workflow: w } = workflow({ lockName: sfn.JsonPath.stringAt('$.tenant') });
    const def = definitionOf(stack, w.cleanupStateMachine);

    expect(def.States['Read Input From Event'].Parameters).toEqual({
      'executionArn.$': '$.detail.executionArn',
      'stateMachineArn.$': '$.detail.stateMachineArn',
      'redriveCount.$': '$.detail.redriveCount',
      'input.$': 'States.StringToJson($.detail.input)',
    });
    // Described because the input was too large for the event: the run that stopped is still the event's.
    expect(def.States['Read Input From Description'].Parameters).toEqual({
      'executionArn.$': '$.detail.executionArn',
      'stateMachineArn.$': '$.detail.stateMachineArn',
      'redriveCount.$': '$.detail.redriveCount',
      'input.$': '$.described.input',
    });
    expect(def.States['Release Permit Of Stopped Execution'].Parameters.Key).toEqual({ lockName: { 'S.$': '$.input.tenant' } });
    expect(def.States['Describe Stopped Execution'].Resource).toMatch(/:states:::aws-sdk:sfn:describeExecution$/);
  });
});

describe('reconciler, leases and metrics', () => {
  test('a reconciler sweeps the table every 5 minutes, with an alarm when it reclaims a permit', () => {
    const { template, workflow: w } = workflow();
    const fnId = logicalId(w.reconciler.reconcilerFunction.node.defaultChild as any);

    template.hasResourceProperties('AWS::Lambda::Function', {
      Runtime: 'nodejs22.x',
      Timeout: 300,
      Environment: {
        Variables: Match.objectLike({
          TABLE_NAME: { Ref: logicalId(w.table.table.node.defaultChild as any) },
          STATE_MACHINE_ARNS: { Ref: logicalId(w.stateMachine.node.defaultChild as any) },
          CLOCK_SKEW_SECONDS: '30',
        }),
      },
    });
    template.hasResourceProperties('AWS::Events::Rule', {
      ScheduleExpression: 'rate(5 minutes)',
      Targets: [Match.objectLike({ Arn: { 'Fn::GetAtt': [fnId, 'Arn'] }, RetryPolicy: { MaximumRetryAttempts: 2 } })],
    });
    template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      MetricName: 'PermitsReclaimed',
      Namespace: 'CdkSfnSemaphore',
      Threshold: 1,
      ComparisonOperator: 'GreaterThanOrEqualToThreshold',
      TreatMissingData: 'notBreaching',
    });
    // Its own log group, and no managed policy.
    template.hasResourceProperties('AWS::Logs::LogGroup', {
      LogGroupName: { 'Fn::Join': ['', ['/aws/lambda/', { Ref: fnId }]] },
    });
    const role = template.toJSON().Resources[logicalId(w.reconciler.reconcilerFunction.role!.node.defaultChild as any)];
    expect(role.Properties.ManagedPolicyArns).toBeUndefined();
  });

  test('the reconciler runs the runtime it is given, and refuses one its bundled handler cannot run on', () => {
    const nodejs24 = new lambda.Runtime('nodejs24.x', lambda.RuntimeFamily.NODEJS);
    const { template } = workflow({ reconcilerRuntime: nodejs24 });
    template.hasResourceProperties('AWS::Lambda::Function', { Runtime: 'nodejs24.x', Timeout: 300 });

    // Node.js 20: Lambda blocks creating functions on it; Python: not the handler's language.
    expect(() => workflow({ reconcilerRuntime: lambda.Runtime.NODEJS_20_X })).toThrow(
      /reconcilerRuntime must be a Node.js runtime, nodejs22.x or newer .*got nodejs20.x/,
    );
    expect(() => workflow({ reconcilerRuntime: lambda.Runtime.PYTHON_3_12 })).toThrow(/reconcilerRuntime must be a Node.js runtime.*got python3.12/);
    expect(() => new SemaphoreReconciler(newStack(), 'R', { table: SemaphoreTable.fromTableName(newStack(), 'T', 't'), runtime: lambda.Runtime.NODEJS_18_X })).toThrow(
      /^runtime must be a Node.js runtime, nodejs22.x or newer .*got nodejs18.x/,
    );
  });

  test('synthesizes with no deprecated aws-cdk-lib API (JSII_DEPRECATED=fail throws on any)', () => {
    const previous = process.env.JSII_DEPRECATED;
    process.env.JSII_DEPRECATED = 'fail';
    try {
      const stack = newStack();
      const key = new kms.Key(stack, 'Key');
      const table = new SemaphoreTable(stack, 'Locks', { encryptionKey: key });
      workflow({ table, dashboard: true, leaseDuration: Duration.minutes(10), idempotency: {}, waitStrategy: WaitStrategy.QUEUE }, stack);
      new ConcurrencyControlledWorkflow(stack, 'Polling', { table, body: new sfn.Pass(stack, 'Poll Work'), waitStrategy: WaitStrategy.POLLING });
      new IdempotentWorkflow(stack, 'Idempotent', { body: new sfn.Pass(stack, 'Idempotent Work') });
      expect(Template.fromStack(stack).findResources('AWS::StepFunctions::StateMachine')).not.toEqual({});
    } finally {
      if (previous === undefined) {
        delete process.env.JSII_DEPRECATED;
      } else {
        process.env.JSII_DEPRECATED = previous;
      }
    }
  });

  test('the reconciler may read, scan and update its table, describe, stop and read the history of this workflow\'s executions, and wake waiters, nothing else', () => {
    const { template, workflow: w } = workflow();

    const statements = policyStatements(template, 'WorkflowReconcilerRole');
    const actions = statements.flatMap((s) => [s.Action].flat()).sort();
    expect(actions).toEqual([
      'dynamodb:DeleteItem', // served tickets the head has passed
      'dynamodb:GetItem',
      'dynamodb:Scan',
      'dynamodb:UpdateItem',
      'logs:CreateLogStream',
      'logs:PutLogEvents',
      'sqs:SendMessage', // invocations that failed every attempt go to the dead-letter queue
      'states:DescribeExecution',
      'states:GetExecutionHistory', // the redrive guard's
      'states:ListExecutions', // each sweep guards redriven executions whose event was lost
      'states:SendTaskSuccess', // the queue's: waiters of the lock can belong to any queue workflow sharing it
      'states:StopExecution',
    ]);
    const wake = statements.find((s) => [s.Action].flat().includes('states:SendTaskSuccess'));
    expect(wake.Resource).toEqual({ Ref: logicalId(w.stateMachine.node.defaultChild as any) });
    for (const action of ['states:StopExecution', 'states:GetExecutionHistory']) {
      const states = statements.find((s) => [s.Action].flat().includes(action));
      expect(JSON.stringify(states.Resource)).toContain(logicalId(w.stateMachine.node.defaultChild as any));
      expect(JSON.stringify(states.Resource)).toContain(':execution:');
    }
    const table = statements.find((s) => [s.Action].flat().includes('dynamodb:Scan'));
    expect(JSON.stringify(table.Resource)).toContain(logicalId(w.table.table.node.defaultChild as any));
  });

  test('an alarm goes off when the reconciler itself fails', () => {
    const { template, workflow: w } = workflow();
    template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      AlarmDescription: Match.stringLikeRegexp('reconciler failed'),
      Threshold: 1,
      Metrics: Match.arrayWith([Match.objectLike({ Expression: 'FILL(invocationErrors, 0) + FILL(holderErrors, 0)' })]),
    });
    expect(w.reconciler.failureAlarm).toBeDefined();
  });

  test('what the reconciler cannot process goes to an encrypted dead-letter queue, and an alarm goes off', () => {
    const { template, workflow: w } = workflow();
    const queue = logicalId(w.reconciler.deadLetterQueue.node.defaultChild as any);
    template.hasResourceProperties('AWS::SQS::Queue', { SqsManagedSseEnabled: true, MessageRetentionPeriod: 14 * 24 * 3600 });
    // Failed asynchronous invocations (sweeps and the redrive guard): two more attempts, then the queue.
    template.hasResourceProperties('AWS::Lambda::EventInvokeConfig', {
      MaximumRetryAttempts: 2,
      DestinationConfig: { OnFailure: { Destination: { 'Fn::GetAtt': [queue, 'Arn'] } } },
    });
    // Redrive events EventBridge could not deliver.
    template.hasResourceProperties('AWS::Events::Rule', {
      EventPattern: Match.objectLike({ detail: Match.objectLike({ status: ['RUNNING'] }) }),
      Targets: [Match.objectLike({ DeadLetterConfig: { Arn: { 'Fn::GetAtt': [queue, 'Arn'] } } })],
    });
    template.hasResourceProperties('AWS::CloudWatch::Alarm', {
      AlarmDescription: Match.stringLikeRegexp('could not process'),
      MetricName: 'ApproximateNumberOfMessagesVisible',
      Threshold: 1,
    });
    expect(w.reconciler.deadLetterAlarm).toBeDefined();
  });

  test('with a customer managed key, every role that touches the table may use the key, on that key only', () => {
    const stack = newStack();
    const key = new kms.Key(stack, 'Key');
    const { template, workflow: w } = workflow({ table: new SemaphoreTable(stack, 'Locks', { encryptionKey: key }) }, stack);
    const keyArn = { 'Fn::GetAtt': [logicalId(key.node.defaultChild as any), 'Arn'] };
    for (const role of ['WorkflowStateMachineRole', 'WorkflowCleanupStateMachineRole', 'WorkflowReconcilerRole']) {
      const kmsStatements = policyStatements(template, role).filter((st) => [st.Action].flat().some((a: string) => a.startsWith('kms:')));
      expect(kmsStatements).toEqual([expect.objectContaining({ Action: expect.arrayContaining(['kms:Decrypt', 'kms:Encrypt']), Resource: keyArn })]);
    }
    expect(w.table.table.encryptionKey).toBe(key);
  });

  test('the redrive guard listens to RUNNING events of redriven executions of this workflow', () => {
    const { template, workflow: w } = workflow();
    template.hasResourceProperties('AWS::Events::Rule', {
      EventPattern: {
        'source': ['aws.states'],
        'detail-type': ['Step Functions Execution Status Change'],
        'detail': {
          status: ['RUNNING'],
          stateMachineArn: [{ Ref: logicalId(w.stateMachine.node.defaultChild as any) }],
          redriveCount: [{ numeric: ['>', 0] }],
        },
      },
    });
    expect(w.reconciler.redriveRule).toBeDefined();
  });

  test('the schedule can be changed or disabled', () => {
    workflow({ reconcileEvery: Duration.minutes(15) }).template.hasResourceProperties('AWS::Events::Rule', { ScheduleExpression: 'rate(15 minutes)' });
    const disabled = workflow({ reconcilerScheduleEnabled: false });
    expect(disabled.workflow.reconciler.rule).toBeUndefined();
    disabled.template.resourceCountIs('AWS::Events::Rule', 2); // the cleanup's and the redrive guard's
  });

  test('fails for a reconcile period under a minute', () => {
    expect(() => workflow({ reconcileEvery: Duration.seconds(30) })).toThrow(
      '`reconcileEvery` must be a whole number of seconds, at least 60 seconds, got: 30 seconds',
    );
  });

  test('a lease is written into the holder entry', () => {
    const { stack, workflow: w } = workflow({ leaseDuration: Duration.minutes(10), waitStrategy: WaitStrategy.POLLING });
    const def = definitionOf(stack, w.stateMachine);

    expect(def.States['Acquire Permit'].Parameters.ExpressionAttributeValues[':entry']).toEqual({
      M: {
        a: { 'S.$': '$$.State.EnteredTime' },
        r: { 'N.$': 'States.JsonToString($$.Execution.RedriveCount)' },
        l: { N: '600' },
      },
    });
    expect(def.States['Wait For Permit'].Branches[0].States['Poll For Permit'].Parameters.ExpressionAttributeValues[':entry'].M.l).toEqual({
      N: '600',
    });
  });

  test('fails for a lease under a second', () => {
    expect(() => workflow({ leaseDuration: Duration.millis(200) })).toThrow(/`leaseDuration` must be a whole number of seconds, at least 1 second/);
  });

  test('metrics of acquisitions, waits and acquire timeouts come from metric filters on the log', () => {
    const { template, workflow: w } = workflow();

    template.hasResourceProperties('AWS::Logs::MetricFilter', {
      FilterPattern: '{ ($.type = "ParallelStateEntered") && ($.details.name = "Run Protected Body") }',
      MetricTransformations: [Match.objectLike({ MetricName: 'Acquisitions', MetricValue: '1' })],
    });
    // A wait starts in Take Ticket, outside the Parallel (entered only when the first wait ends otherwise);
    // where the wait runs in the Parallel, it is entered once a wait (a round logs ParallelStateStarted).
    template.hasResourceProperties('AWS::Logs::MetricFilter', {
      FilterPattern: '{ ($.type = "TaskStateEntered") && ($.details.name = "Take Ticket") }',
      MetricTransformations: [Match.objectLike({ MetricName: 'Waits' })],
    });
    for (const inParallel of [workflow({ permitPath: '$.permit' }), workflow({ waitStrategy: WaitStrategy.POLLING })]) {
      inParallel.template.hasResourceProperties('AWS::Logs::MetricFilter', {
        FilterPattern: '{ ($.type = "ParallelStateEntered") && ($.details.name = "Wait For Permit") }',
        MetricTransformations: [Match.objectLike({ MetricName: 'Waits' })],
      });
    }
    template.hasResourceProperties('AWS::Logs::MetricFilter', {
      FilterPattern: '{ ($.type = "ExecutionFailed") && ($.details.error = "SemaphoreAcquireTimeout") }',
      MetricTransformations: [Match.objectLike({ MetricName: 'AcquireTimeouts' })],
    });
    expect(w.metricAcquisitions().metricName).toBe('Acquisitions');
    expect(w.metricWaits().namespace).toBe(w.metricsNamespace);
    expect(w.metricAcquireTimeouts().metricName).toBe('AcquireTimeouts');
    expect(w.metricBodySlotWaits().metricName).toBe('BodySlotWaits');
    // The filter for waits for a body slot exists only where there are body slots (test/rate-limit.test.ts counts it on a run).
    template.resourceCountIs('AWS::Logs::MetricFilter', 3);
    const slots = workflow({ rateLimit: RateLimit.perSecond(10), concurrencyLimit: 5 }).template;
    slots.resourceCountIs('AWS::Logs::MetricFilter', 4);
    slots.hasResourceProperties('AWS::Logs::MetricFilter', {
      FilterPattern: '{ ($.type = "ParallelStateEntered") && ($.details.name = "Wait For Body Slot") }',
      MetricTransformations: [Match.objectLike({ MetricName: 'BodySlotWaits', MetricValue: '1' })],
    });
  });

  test('warns that a high limit with the queue meets the partition\'s write capacity, with the figures and the id that acknowledges it', () => {
    const { stack: high } = workflow({ concurrencyLimit: 500 });
    // 0.1 + 0.11 x 500 = 55.1 KB, 56 write units a write, five writes an execution through the full lock (two on its way in,
    // three to pass it a permit): 3.57 a second, 500 / 3.57 = 140 s. Split into 10 of 50: 0.1 + 0.11 x 50 = 5.6 KB, 6 units,
    // 33.3 a second, 50 / 33.3 = 1.5 s.
    Annotations.fromStack(high).hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp(
        'concurrencyLimit 500 with the queue: the lock item is about 55 KB with 500 holders, and every execution that waits writes all of it five times .*at most about 3\\.6 permits a second: ' +
          'bodies shorter than about 140 s .*`lockStripes: 10`, 10 locks of 50, which by the same measure keep up with bodies of about 1\\.5 s and longer.*cdk-sfn-semaphore:highQueueLimit',
      ),
    );
    // 300 into locks of at most 50: 6 (7 to 9 do not divide it).
    Annotations.fromStack(workflow({ concurrencyLimit: 300 }).stack).hasWarning('/Stack/Workflow', Match.stringLikeRegexp('`lockStripes: 6`, 6 locks of 50,'));
    // A prime limit splits only into locks of one: the message names a limit that splits.
    Annotations.fromStack(workflow({ concurrencyLimit: 101 }).stack).hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp('`lockStripes` must divide the limit, and none up to 100 splits 101 into locks of 50 or fewer: for example `concurrencyLimit: 102, lockStripes: 3`'),
    );
    // Split already, but into stripes of 200: the suggestion is for the whole limit of 1,000.
    Annotations.fromStack(workflow({ concurrencyLimit: 1000, lockStripes: 5 }).stack).hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp('concurrencyLimit 200 per stripe with the queue: .*`lockStripes: 20`, 20 locks of 50,'),
    );
    // 100 stripes of 200: locks of 50 would take 400 stripes, beyond the most a lock may have.
    Annotations.fromStack(workflow({ concurrencyLimit: 20000, lockStripes: 100 }).stack).hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp('at most `lockStripes: 100`, 100 locks of 200 or more: beyond that, lock names of their own for groups of callers'),
    );
    // With what a split lock does not serve yet, the advice is polling, not a split synth would refuse.
    const weighted = workflow({ concurrencyLimit: 500, permits: 2 }).stack;
    Annotations.fromStack(weighted).hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp('use WaitStrategy.POLLING .*: splitting the lock \\(`lockStripes`\\) does not combine with `permits` yet'),
    );
    Annotations.fromStack(weighted).hasNoWarning('/Stack/Workflow', Match.stringLikeRegexp('for example `lockStripes'));
    for (const quiet of [{ concurrencyLimit: 99 }, { concurrencyLimit: 500, waitStrategy: WaitStrategy.POLLING }, { concurrencyLimit: sfn.JsonPath.numberAt('$.limit') }]) {
      Annotations.fromStack(workflow(quiet).stack).hasNoWarning('/Stack/Workflow', Match.stringLikeRegexp('with the queue'));
    }
    // With polling an execution through a full lock writes the item at least three times (its refused acquire, the poll that
    // finds a permit, its release): 1,000 / (3 x 56) = 6.0 a second at 500, and 55.6 for a lock of 50 (6 units), 0.9 s; its own
    // id, and no advice to poll.
    const polling = Annotations.fromStack(workflow({ concurrencyLimit: 500, waitStrategy: WaitStrategy.POLLING }).stack);
    polling.hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp(
        '^concurrencyLimit 500 with polling: the lock item is about 55 KB with 500 holders, and every execution that waits writes all of it at least three times .*at most about 6\\.0 permits a second: ' +
          'bodies shorter than about 84 s .*`lockStripes: 10`, 10 locks of 50, which by the same measure keep up with bodies of about 0\\.9 s and longer.*, or spread the arrivals.*cdk-sfn-semaphore:highPollingLimit',
      ),
    );
    polling.hasNoWarning('/Stack/Workflow', Match.stringLikeRegexp('WaitStrategy.POLLING'));
    Annotations.fromStack(workflow({ concurrencyLimit: 99, waitStrategy: WaitStrategy.POLLING }).stack).hasNoWarning('/Stack/Workflow', Match.stringLikeRegexp('with polling'));
  });

  test('warns of a rate the lock item cannot pass on, by the rate asked and the entries the item holds, and of no rate it can', () => {
    const rateWarning = Match.stringLikeRegexp('^rateLimit of');
    // 200 a second: 0.1 + 0.11 x 200 = 22.1 KB, 23 units, five writes an execution: 8.7 a second against 200.
    Annotations.fromStack(workflow({ rateLimit: RateLimit.perSecond(200) }).stack).hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp(
        '^rateLimit of 200 per 1 s with the queue: .*about 22 KB with 200 permits, and .*at most about 8\\.7 permits a second, below the 200\\.0 a second it allows: ' +
          '.*a lock name of its own with a share of the rate \\(README.*cdk-sfn-semaphore:highQueueLimit',
      ),
    );
    // 50 a second: 5.6 KB, 6 units, 33.3 a second (a bound of 55.6 counted only the passage, and let it through before 2026-12-02).
    // 10 a second beside 500 body slots: 510 entries, 56.2 KB, 57 units, 3.5 a second.
    Annotations.fromStack(workflow({ rateLimit: RateLimit.perSecond(50) }).stack).hasWarning('/Stack/Workflow', Match.stringLikeRegexp('at most about 33\\.3 permits a second, below the 50\\.0'));
    Annotations.fromStack(workflow({ rateLimit: RateLimit.perSecond(10), concurrencyLimit: 500 }).stack).hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp('with 10 permits and 500 body slots, and .*at most about 3\\.5 permits a second, below the 10\\.0 .*a `concurrencyLimit` of 10 or less'),
    );
    // Polling: three writes an execution, not five: at 200 a second 1,000 / (3 x 23) = 14.5, with its own id.
    Annotations.fromStack(workflow({ rateLimit: RateLimit.perSecond(200), waitStrategy: WaitStrategy.POLLING }).stack).hasWarning(
      '/Stack/Workflow',
      Match.stringLikeRegexp('^rateLimit of 200 per 1 s with polling: .*at most about 14\\.5 permits a second, below the 200\\.0 .*cdk-sfn-semaphore:highPollingLimit'),
    );
    // Within what the item passes on: 200 a minute asks 3.3 a second, 40 a second 40 at most (4.5 KB, 5 units, 1,000 / (5 x 5));
    // 50 a second, which the queue cannot pass on (33.3), polling can: 1,000 / (3 x 6) = 55.6.
    for (const quiet of [
      { rateLimit: RateLimit.perMinute(200) },
      { rateLimit: RateLimit.perSecond(40) },
      { rateLimit: RateLimit.perSecond(10), concurrencyLimit: 5 },
      { rateLimit: RateLimit.perSecond(50), waitStrategy: WaitStrategy.POLLING },
    ]) {
      const annotations = Annotations.fromStack(workflow(quiet).stack);
      annotations.hasNoWarning('/Stack/Workflow', rateWarning);
      // Nor the concurrency limit's warning, whose figures are the bodies' and not the rate's.
      annotations.hasNoWarning('/Stack/Workflow', Match.stringLikeRegexp('^concurrencyLimit \\d+ '));
    }
  });

  test('warns that the log metrics stay empty when the state machine does not log at level ALL', () => {
    const stack = newStack();
    const { stack: s } = workflow({ logs: { destination: new logs.LogGroup(stack, 'Quiet'), level: sfn.LogLevel.ERROR } }, stack);
    Annotations.fromStack(s).hasWarning('/Stack/Workflow', Match.stringLikeRegexp('does not log at level ALL'));
  });

  test('an optional dashboard shows executions, permits and reclaims', () => {
    workflow().template.resourceCountIs('AWS::CloudWatch::Dashboard', 0);

    const body = JSON.stringify(workflow({ dashboard: true, lockName: 'db' }).template.findResources('AWS::CloudWatch::Dashboard'));

    expect(body).toContain('ExecutionsStarted');
    expect(body).toContain('Acquisitions');
    expect(body).toContain('PermitsReclaimed');
    expect(body).toContain('PermitsInUse');
    expect(body).toContain('Queued');
    // Only a workflow with a rate shows the permits the rate holds.
    expect(body).not.toContain('PermitsHeldForRate');
    expect(body).not.toContain('WaitingForRate');
    const rated = JSON.stringify(
      workflow({ dashboard: true, lockName: 'db', rateLimit: RateLimit.perSecond(5) }).template.findResources('AWS::CloudWatch::Dashboard'),
    );
    expect(rated).toContain('PermitsHeldForRate');
    expect(rated).toContain('WaitingForRate');
    expect(rated).not.toContain('BodySlotWaits');
    const slots = JSON.stringify(
      workflow({ dashboard: true, lockName: 'db', rateLimit: RateLimit.perSecond(5), concurrencyLimit: 2 }).template.findResources('AWS::CloudWatch::Dashboard'),
    );
    expect(slots).toContain('BodySlotWaits');
  });
});

describe('least privilege', () => {
  test('the workflow may only UpdateItem, read and delete (the queue\'s tickets), on its table, and wake waiters (SendTaskSuccess, SendTaskHeartbeat)', () => {
    const { template, workflow: w } = workflow();
    const tableId = logicalId(w.table.table.node.defaultChild as any);

    const dynamo = policyStatements(template, 'WorkflowStateMachineRole').filter((s) => JSON.stringify(s.Action).includes('dynamodb:'));
    const onTable = {
      'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':dynamodb:', { Ref: 'AWS::Region' }, ':', { Ref: 'AWS::AccountId' }, ':table/', { Ref: tableId }]],
    };
    // UpdateItem everywhere; GetItem to read a ticket another releaser served; DeleteItem to serve a ticket, and to leave the queue.
    expect(dynamo.map((s) => s.Action).sort()).toEqual(['dynamodb:DeleteItem', 'dynamodb:GetItem', 'dynamodb:UpdateItem']);
    for (const statement of dynamo) expect(statement).toEqual({ Action: statement.Action, Effect: 'Allow', Resource: onTable });
    const actions = policyStatements(template, 'WorkflowStateMachineRole').flatMap((s) => [s.Action].flat());
    expect(actions.filter((a) => !a.startsWith('xray:') && !a.startsWith('logs:')).sort()).toEqual([
      'dynamodb:DeleteItem',
      'dynamodb:GetItem',
      'dynamodb:UpdateItem',
      'states:SendTaskHeartbeat',
      'states:SendTaskSuccess',
    ]);
    // Waiters of the lock are executions of the queue workflows sharing the table: here, its own.
    const wake = policyStatements(template, 'WorkflowStateMachineRole').filter((s) => JSON.stringify(s.Action).includes('states:SendTask'));
    expect(wake).toEqual([
      { Action: ['states:SendTaskSuccess', 'states:SendTaskHeartbeat'], Effect: 'Allow', Resource: { Ref: logicalId(w.stateMachine.node.defaultChild as any) } },
    ]);
  });

  test('the cleanup may only update, read and delete on the table, and DescribeExecution on this workflow when the lock name is in the input', () => {
    const fixed = workflow();
    const fixedActions = policyStatements(fixed.template, 'WorkflowCleanupStateMachineRole')
      .flatMap((s) => [s.Action].flat())
      .filter((a) => !a.startsWith('xray:') && !a.startsWith('logs:'));
    expect(fixedActions.sort()).toEqual(['dynamodb:DeleteItem', 'dynamodb:GetItem', 'dynamodb:UpdateItem', 'states:SendTaskHeartbeat', 'states:SendTaskSuccess']);

    const runtime = workflow({ lockName: sfn.JsonPath.stringAt('$.tenant') });
    const statements = policyStatements(runtime.template, 'WorkflowCleanupStateMachineRole');
    const describe = statements.find((s) => s.Action === 'states:DescribeExecution');
    expect(JSON.stringify(describe.Resource)).toMatch(/:execution:/);
    expect(statements.flatMap((s) => [s.Action].flat()).filter((a) => !a.startsWith('xray:') && !a.startsWith('logs:')).sort()).toEqual([
      'dynamodb:DeleteItem',
      'dynamodb:GetItem',
      'dynamodb:UpdateItem',
      'states:DescribeExecution',
      'states:SendTaskHeartbeat',
      'states:SendTaskSuccess',
    ]);
  });

  test('delegates grants and metrics to the state machine', () => {
    const { workflow: w, stack } = workflow();
    const role = new iam.Role(stack, 'Caller', { assumedBy: new iam.AccountRootPrincipal() });

    w.grantStartExecution(role);
    w.grantRead(role);

    const actions = policyStatements(Template.fromStack(stack), 'Caller').flatMap((s) => [s.Action].flat());
    expect(actions).toEqual(expect.arrayContaining(['states:StartExecution', 'states:DescribeExecution']));
    expect(stack.resolve(w.metricFailed().dimensions)).toEqual({ StateMachineArn: { Ref: logicalId(w.stateMachine.node.defaultChild as any) } });
    expect(w.metricAborted().metricName).toBe('ExecutionsAborted');
    expect(w.metricTime().metricName).toBe('ExecutionTime');
  });
});

/** The resources of each policy statement that grants `action`, by the roles the policy is attached to. */
function grantsOf(template: Template, action: string): Record<string, any[]> {
  const result: Record<string, any[]> = {};
  for (const policy of Object.values(template.findResources('AWS::IAM::Policy')) as any[]) {
    for (const statement of policy.Properties.PolicyDocument.Statement) {
      if ([statement.Action].flat().includes(action)) {
        for (const role of policy.Properties.Roles) {
          result[role.Ref] = [...(result[role.Ref] ?? []), ...[statement.Resource].flat()];
        }
      }
    }
  }
  return result;
}

describe('who may wake the waiters of a lock (states:SendTaskSuccess)', () => {
  test('every role that releases may wake exactly the queue workflows sharing the table, with no dependency cycle', () => {
    const stack = newStack();
    const table = new SemaphoreTable(stack, 'Locks');
    const a = new ConcurrencyControlledWorkflow(stack, 'A', { table, lockName: 'shared', body: new sfn.Pass(stack, 'Work A') });
    const polling = new ConcurrencyControlledWorkflow(stack, 'P', { table, lockName: 'shared', body: new sfn.Pass(stack, 'Work P'), waitStrategy: WaitStrategy.POLLING });
    const client = new iam.Role(stack, 'Client', { assumedBy: new iam.AccountRootPrincipal() });
    table.grantClient(client);
    // Defined after the others: their grants follow.
    const b = new ConcurrencyControlledWorkflow(stack, 'B', { table, lockName: 'shared', body: new sfn.Pass(stack, 'Work B') });
    const template = Template.fromStack(stack);

    const waiters = [{ Ref: logicalId(a.stateMachine.node.defaultChild as any) }, { Ref: logicalId(b.stateMachine.node.defaultChild as any) }];
    const grants = grantsOf(template, 'states:SendTaskSuccess');
    const wakers = [a, polling, b].flatMap((w) => [w.stateMachine.role, w.cleanupStateMachine.role, w.reconciler.reconcilerFunction.role!]);
    expect(Object.keys(grants).sort()).toEqual([...wakers, client].map((r) => logicalId(r.node.defaultChild as any)).sort());
    for (const resources of Object.values(grants)) expect(resources).toEqual(waiters);
    // The polling workflow's executions never wait on a token: no one is granted its ARN.
    expect(JSON.stringify(grants)).not.toContain(logicalId(polling.stateMachine.node.defaultChild as any));
  });

  test('Template.fromStack refuses a dependency cycle, such as a role\'s default policy granting its own state machine', () => {
    // So every template read in these tests is free of cycles, which CloudFormation refuses.
    const stack = newStack();
    const w = new ConcurrencyControlledWorkflow(stack, 'Workflow', { body: new sfn.Pass(stack, 'Work') });
    w.stateMachine.addToRolePolicy(new iam.PolicyStatement({ actions: ['states:SendTaskSuccess'], resources: [w.stateMachine.stateMachineArn] }));
    expect(() => Template.fromStack(stack)).toThrow(/cycl/i);
  });

  test('externalWaiters: every state machine of the account and Region, for a table or an import', () => {
    for (const makeTable of [
      (stack: Stack) => new SemaphoreTable(stack, 'Locks', { externalWaiters: true }),
      (stack: Stack) => SemaphoreTable.fromTableAttributes(stack, 'Locks', { tableName: 'shared-locks', externalWaiters: true }),
    ]) {
      const stack = newStack();
      const table = makeTable(stack);
      const w = new ConcurrencyControlledWorkflow(stack, 'Workflow', { table, lockName: 'shared', body: new sfn.Pass(stack, 'Work') });
      const grants = grantsOf(Template.fromStack(stack), 'states:SendTaskSuccess');
      expect(grants[logicalId(w.stateMachine.role.node.defaultChild as any)]).toEqual([
        { 'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':states:', { Ref: 'AWS::Region' }, ':', { Ref: 'AWS::AccountId' }, ':stateMachine:*']] },
      ]);
    }
  });

  test('imports of one table name share their waiters; a client with no waiter to wake gets no wake grant', () => {
    const stack = newStack();
    const client = new iam.Role(stack, 'Client', { assumedBy: new iam.AccountRootPrincipal() });
    SemaphoreTable.fromTableName(stack, 'ForClient', 'shared-locks').grantClient(client);
    expect(grantsOf(Template.fromStack(stack), 'states:SendTaskSuccess')).toEqual({});

    const stack2 = newStack();
    const client2 = new iam.Role(stack2, 'Client', { assumedBy: new iam.AccountRootPrincipal() });
    SemaphoreTable.fromTableName(stack2, 'ForClient', 'shared-locks').grantClient(client2);
    const w = new ConcurrencyControlledWorkflow(stack2, 'Workflow', {
      table: SemaphoreTable.fromTableName(stack2, 'ForWorkflow', 'shared-locks'),
      lockName: 'shared',
      body: new sfn.Pass(stack2, 'Work'),
    });
    expect(grantsOf(Template.fromStack(stack2), 'states:SendTaskSuccess')[logicalId(client2.node.defaultChild as any)]).toEqual([
      { Ref: logicalId(w.stateMachine.node.defaultChild as any) },
    ]);
  });

  test('across stacks: a waiter is named by its stateMachineName, or, generated, by a wildcard with a warning; no cyclic stacks', () => {
    const app = new App();
    const shared = new Stack(app, 'Shared');
    const table = new SemaphoreTable(shared, 'Locks');
    const s1 = new Stack(app, 'One');
    const s2 = new Stack(app, 'Two');
    new ConcurrencyControlledWorkflow(s1, 'A', { table, lockName: 'shared', body: new sfn.Pass(s1, 'Work A') });
    const b = new ConcurrencyControlledWorkflow(s2, 'B', { table, lockName: 'shared', body: new sfn.Pass(s2, 'Work B'), stateMachineName: 'b-flow' });
    app.synth();

    const one = grantsOf(Template.fromStack(s1), 'states:SendTaskSuccess');
    const two = grantsOf(Template.fromStack(s2), 'states:SendTaskSuccess');
    const byName = { 'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':states:', { Ref: 'AWS::Region' }, ':', { Ref: 'AWS::AccountId' }, ':stateMachine:b-flow']] };
    const wildcard = { 'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':states:', { Ref: 'AWS::Region' }, ':', { Ref: 'AWS::AccountId' }, ':stateMachine:*']] };
    // One's roles wake A (its own stack: by reference) and B (by name).
    for (const resources of Object.values(one)) expect(resources).toEqual([expect.objectContaining({ Ref: expect.stringMatching(/^AStateMachine/) }), byName]);
    // Two's roles wake A, whose name CloudFormation generates: every state machine, with a warning.
    for (const resources of Object.values(two)) expect(resources).toEqual([wildcard, { Ref: logicalId(b.stateMachine.node.defaultChild as any) }]);
    expect(Annotations.fromStack(s2).findWarning('*', Match.stringLikeRegexp('One/A/StateMachine waits on a shared lock from another stack'))).not.toHaveLength(0);
  });
});

describe('the lock item', () => {
  /** Bytes an entry adds to a lock item, as DynamoDB (and dynalite, which the capacity model bills by) counts them. */
  const entryBytes = (holder: string, fields: Record<string, unknown>) =>
    itemSizeBytes({ [LOCK_KEY]: { S: 'lock' }, [holder]: { M: fields } }) - itemSizeBytes({ [LOCK_KEY]: { S: 'lock' } });

  test("an execution's holder id turns back into its ARN given its state machine's, and old ARN ids still read", () => {
    const sm = 'arn:aws:states:eu-west-1:123456789012:stateMachine:WorkflowStateMachine1A2B3C4D-AbCdEfGhIjKl';
    const arn = 'arn:aws:states:eu-west-1:123456789012:execution:WorkflowStateMachine1A2B3C4D-AbCdEfGhIjKl:6f1c2a3b-0000-4000-8000-123456789abc';
    // The same name in another account, in another Region, and another name.
    const others = [sm.replace('123456789012', '210987654321'), sm.replace('eu-west-1', 'eu-west-2'), sm.replace(/[^:]+$/, 'Other')];
    const key = executionHolderKeyOfArn(arn)!;
    expect(key).toBe(`${createHash('md5').update(sm).digest('hex')}:6f1c2a3b-0000-4000-8000-123456789abc`);
    // A version's or an alias's ARN names the same state machine.
    expect([executionHolderKey(sm, '6f1c2a3b-0000-4000-8000-123456789abc'), executionHolderKey(`${sm}:7`, '6f1c2a3b-0000-4000-8000-123456789abc')]).toEqual([key, key]);
    expect(arn.length - key.length).toBe(57); // the ARN's prefix (48), the state machine's name (41) and a colon, against 33
    expect(executionArnOfHolder(key, [...others, sm])).toBe(arn);
    expect(executionArnOfHolder(key, [`${sm}:prod`])).toBe(arn);
    expect(executionArnOfHolder(key, others)).toBeUndefined();
    // An id written by a version before the short ids: the ARN itself, ours only with its state machine.
    expect(executionArnOfHolder(arn, [sm])).toBe(arn);
    expect(executionArnOfHolder(arn, others)).toBeUndefined();
    expect([key, arn, 'lease-6f1c2a3b-0000-4000-8000-123456789abc', 'abc:def'].map(isExecutionHolder)).toEqual([true, true, false, false]);
    expect(executionHolderKeyOfArn('lease-6f1c2a3b')).toBeUndefined();
    expect(executionHolderKeyOfArn(sm)).toBeUndefined();
  });

  test('the largest holder entry fits the bound that caps concurrencyLimit', () => {
    // The longest execution ARN Step Functions allows: partition, a 14-character Region, two names of 80 characters.
    // Versions before the short holder ids keyed an entry by it; an upgrade may find such entries.
    const arn = `arn:aws-us-gov:states:ap-southeast-4:123456789012:execution:${'s'.repeat(80)}:${'e'.repeat(80)}`;
    const key = executionHolderKeyOfArn(arn)!;
    const stateMachineArn = `arn:aws-us-gov:states:ap-southeast-4:123456789012:stateMachine:${'s'.repeat(80)}`;
    expect(key).toBe(`${createHash('md5').update(stateMachineArn).digest('hex')}:${'e'.repeat(80)}`);
    // Every field an execution's entry can carry, at once (no entry has them all: an over-estimate).
    const fields = {
      [HOLDER_ACQUIRED_AT]: { S: '2026-11-28T20:00:00.000Z' },
      [HOLDER_REDRIVE_COUNT]: { N: '1000' },
      [HOLDER_LEASE_SECONDS]: { N: '31536000' },
      [HOLDER_HANDOFF_ID]: { S: `${'0'.repeat(36)}/1000` },
      [HOLDER_CLAIMED]: { BOOL: true },
      [HOLDER_FENCING_TOKEN]: { N: '123456789012345' },
      [HOLDER_PERMITS]: { N: String(MAX_PERMITS) },
      [HOLDER_EXTRA_PERMITS]: { N: String(MAX_PERMITS - 1) },
      [HOLDER_COLLECTING]: { N: '1' },
      [HOLDER_IN_BODY]: { N: '1' },
    };
    const execution = entryBytes(arn, fields);
    const keyed = entryBytes(key, fields);
    const client = entryBytes(`lease-${'0'.repeat(36)}`, {
      [HOLDER_ACQUIRED_AT]: { S: '2026-11-28T20:00:00.000Z' },
      [HOLDER_LEASE_EXPIRES_AT]: { N: '1795000000000' },
      [HOLDER_OWNER]: { S: 'o'.repeat(MAX_OWNER_LENGTH) },
      [HOLDER_PERMITS]: { N: String(MAX_PERMITS) },
      [HOLDER_EXTRA_PERMITS]: { N: String(MAX_PERMITS - 1) },
    });
    expect(execution).toBeLessThanOrEqual(MAX_HOLDER_ENTRY_BYTES);
    expect(keyed).toBeLessThanOrEqual(MAX_HOLDER_ENTRY_BYTES);
    expect(client).toBeLessThanOrEqual(MAX_HOLDER_ENTRY_BYTES);
    // One-letter field names: the key is most of an entry; the short one saves the ARN's prefix and the state machine's name.
    expect(execution - arn.length).toBeLessThan(120);
    expect(execution - keyed).toBe(arn.length - key.length);
    expect(key.length).toBe(113);
    // A thousand of the largest entries and the counters stay inside DynamoDB's 400 KB (409,600 bytes) per item.
    expect(MAX_CONCURRENCY_LIMIT * MAX_HOLDER_ENTRY_BYTES + 1000).toBeLessThan(409600);
  });
});

describe('bad input fails at synth with the prop, the value and what is allowed', () => {
  test.each([0, -1, 1.5, 1001])('fails for concurrencyLimit %p', (limit) => {
    expect(() => workflow({ concurrencyLimit: limit })).toThrow(
      `\`concurrencyLimit\` must be an integer from 1 to 1000 (the lock item keeps one entry per holder, at most 380 bytes each, inside DynamoDB's 400 KB per item), got: ${limit}`,
    );
  });

  test('refuses an acquireTimeout longer than the wait\'s history budget holds, per strategy', () => {
    expect(() => workflow({ acquireTimeout: Duration.seconds(1198 * 300 + 1) })).toThrow(
      '`acquireTimeout` (4 days 3 hours 50 minutes 1 second) is longer than a wait can last: 1198 rounds of `queueCheckInterval` (5 minutes), ' +
        '4 days 3 hours 50 minutes, fit in the 18000 history events the wait may spend (Step Functions fails an execution at 25,000 events): ' +
        'make it at most 4 days 3 hours 50 minutes, or `queueCheckInterval` longer',
    );
    expect(() => workflow({ acquireTimeout: Duration.seconds(1198 * 300) })).not.toThrow();
    expect(() => workflow({ waitStrategy: WaitStrategy.POLLING, acquireTimeout: Duration.hours(3) })).toThrow(
      /^`acquireTimeout` \(3 hours\) is longer than a wait can last: 2568 rounds of `pollInterval` \(3 seconds\), 2 hours 8 minutes 24 seconds, fit in the 18000 history events/,
    );
    // Idempotency's wait for a duplicate takes its share first: 391 checks at most, 23 events each.
    const idempotent = workflow({ idempotency: {} }).workflow;
    expect(idempotent.longestWait?.toSeconds()).toBe(Math.floor((18000 - 391 * 23 - 20) / 15) * 300);
  });

  test('accepts concurrencyLimit 1000, the most whose holders fit in one item', () => {
    expect(() => workflow({ concurrencyLimit: 1000 })).not.toThrow();
  });

  test('fails for an empty lock name', () => {
    expect(() => workflow({ lockName: '' })).toThrow("`lockName` must be 1 to 255 characters long, got: '' (0 characters)");
  });

  test('fails for an over-long lock name', () => {
    expect(() => workflow({ lockName: 'x'.repeat(256) })).toThrow(/`lockName` must be 1 to 255 characters long, got: 'x{37}\.\.\.' \(256 characters\)/);
  });

  test('fails for a lock name with curly braces, which intrinsic functions reserve', () => {
    expect(() => workflow({ lockName: 'jobs-{prod}' })).toThrow("`lockName` must not contain '{' or '}' (the state machines use it in an intrinsic function), got: 'jobs-{prod}'");
  });

  test('fails for a lock name with the ticket key separator (U+001F)', () => {
    expect(() => workflow({ lockName: 'jobs\u001f1' })).toThrow('`lockName` must not contain the character U+001F (the unit separator, which keys the queue\'s ticket items), got: "jobs\\u001f1"');
  });

  test('fails for a poll interval under 1 second', () => {
    expect(() => workflow({ pollInterval: Duration.millis(500) })).toThrow(
      '`pollInterval` must be a whole number of seconds, at least 1 second, got: 500 millis',
    );
  });

  test('fails for a poll interval that is not whole seconds', () => {
    expect(() => workflow({ pollInterval: Duration.millis(1500) })).toThrow(/`pollInterval` must be a whole number of seconds.*got: 1 second 500 millis/);
  });

  test('fails for a non-positive acquire timeout', () => {
    expect(() => workflow({ acquireTimeout: Duration.seconds(0) })).toThrow(
      '`acquireTimeout` must be a whole number of seconds, at least 1 second, got: 0 seconds',
    );
  });

  test('fails for an Express state machine', () => {
    expect(() => workflow({ stateMachineType: sfn.StateMachineType.EXPRESS })).toThrow(
      /`stateMachineType` must be STANDARD, got: EXPRESS\. Express executions emit no status-change events/,
    );
  });

  test('fails for a lock name that concatenates a JSONPath with text', () => {
    expect(() => workflow({ lockName: `tenant-${sfn.JsonPath.stringAt('$.tenant')}` })).toThrow(
      /`lockName` must be either a fixed string or exactly one JsonPath.stringAt/,
    );
  });

  test('fails for a lock name read from the context object', () => {
    expect(() => workflow({ lockName: sfn.JsonPath.stringAt('$$.Execution.Name') })).toThrow(
      '`lockName` can be read from the execution input only (a path starting with `$.` or `$$.Execution.Input`), got: $$.Execution.Name',
    );
  });

  test('does not check values that are only known at deploy time', () => {
    const stack = newStack();
    const limit = new CfnParameter(stack, 'Limit', { type: 'Number' }).valueAsNumber;
    const name = new CfnParameter(stack, 'Name').valueAsString;

    const { stack: s, workflow: w } = workflow({ concurrencyLimit: limit, lockName: name }, stack);

    const def = Template.fromStack(s).toJSON().Resources[logicalId(w.stateMachine.node.defaultChild as any)];
    expect(JSON.stringify(def.Properties.DefinitionString)).toContain('{"Ref":"Limit"}');
  });
});
