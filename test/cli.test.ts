import { ChildProcess, spawn } from 'child_process';
import * as path from 'path';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { stateMachineLogicalId, WorkTracker, workflowStack } from './helpers';
import { main, parseDuration } from '../client/cli';
import { SemaphoreClient } from '../client/semaphore-client';
import { Simulator } from '../simulator';

/*
 * The CLI and the client against dynalite, on the very lock item a workflow executing in the simulator
 * uses. The CLI runs as the package's bin (the esbuild bundle the test command builds first) where
 * processes and signals matter, in process elsewhere. Simulated time runs 100 times faster than the
 * CLI's real time.
 */

const BIN = path.resolve(__dirname, '..', 'assets', 'client', 'cli', 'cdk-sfn-semaphore.js');
const LOCK = 'TestStack/Workflow';

let sim: Simulator;
let table: string;
let env: NodeJS.ProcessEnv;
let work: WorkTracker;
/** Resolves the body of the execution that is inside. */
let finishBody: (() => void) | undefined;

beforeAll(async () => {
  const { stack, workFunctionId } = workflowStack({ concurrencyLimit: 1 });
  work = new WorkTracker();
  sim = await Simulator.start(stack, {
    // The reconciler would judge the CLI's real-time leases by the simulation's faster clock.
    schedules: false,
    lambdaHandlers: {
      [workFunctionId]: async (input: any, context) => {
        if (input.hold) await new Promise<void>((resolve) => (finishBody = resolve));
        return work.handler(input, context);
      },
    },
  });
  table = [...sim.resources.values()].find((r) => r.type === 'AWS::DynamoDB::Table')!.ref;
  env = {
    ...process.env,
    AWS_ENDPOINT_URL_DYNAMODB: sim.db.endpoint,
    AWS_REGION: 'us-east-1',
    AWS_ACCESS_KEY_ID: 'local',
    AWS_SECRET_ACCESS_KEY: 'local',
    CDK_SFN_SEMAPHORE_TABLE: table,
  };
});

afterAll(async () => {
  await sim.stop();
});

function client(clockSkewSeconds?: number) {
  return new SemaphoreClient({
    tableName: table,
    clockSkewSeconds,
    dynamodb: new DynamoDBClient({ endpoint: sim.db.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'local', secretAccessKey: 'local' } }),
  });
}

/** The CLI in this process: exit code and what it wrote. */
async function cli(...argv: string[]) {
  const out: string[] = [];
  const err: string[] = [];
  const code = await main(argv, { stdout: (l) => out.push(l), stderr: (l) => err.push(l), env });
  return { code, stdout: out.join('\n'), stderr: err.join('\n') };
}

/** The CLI as a process (the bin), with its output collected. */
function binary(...argv: string[]): { child: ChildProcess; done: Promise<{ code: number | null; stdout: string; stderr: string }> } {
  const child = spawn(process.execPath, [BIN, ...argv], { env });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d) => (stdout += d));
  child.stderr!.on('data', (d) => (stderr += d));
  const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code: code ?? (signal ? -1 : null), stdout, stderr })),
  );
  return { child, done };
}

/** What the CLI itself wrote to stderr (the AWS SDK warns about Node 20 on its own). */
function ownLines(stderr: string): string[] {
  return stderr.split('\n').filter((line) => line.startsWith('cdk-sfn-semaphore:'));
}

async function until(condition: () => Promise<boolean>, what: string, timeoutMs = 20_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

afterEach(async () => {
  // Every test leaves the lock free.
  const status = await client().status(LOCK);
  expect(status.holders).toEqual([]);
  expect(status.permitsInUse).toBe(0);
});

describe('CLI holders and workflow executions share one lock', () => {
  test('a CLI lease makes an execution wait; the release lets it in', async () => {
    const acquired = await binary('acquire', LOCK, '--limit', '1', '--no-wait', '--owner', 'deploy-script').done;
    expect(acquired.code).toBe(0);
    const leaseId = acquired.stdout.trim();
    expect(leaseId).toMatch(/^lease-[0-9a-f-]{36}$/);

    const execution = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { n: 1 });
    // A second of real time is 100 s of polling in the simulation.
    await new Promise((r) => setTimeout(r, 1000));
    expect(execution.status).toBe('RUNNING');
    expect(execution.stateTransitions.get('Poll For Permit')).toBeGreaterThan(5);
    expect(work.byExecution.has(execution.arn)).toBe(false);

    const status = JSON.parse((await cli('status', LOCK, '--json')).stdout);
    expect(status).toMatchObject({ lockName: LOCK, permitsInUse: 1, limit: 1, holders: [{ id: leaseId, kind: 'lease', owner: 'deploy-script', expired: false }] });

    expect((await binary('release', LOCK, leaseId).done).code).toBe(0);
    await execution.done;
    expect(execution.status).toBe('SUCCEEDED');
  });

  test('an execution inside makes the CLI wait or give up with exit code 3, then get the permit', async () => {
    const execution = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { hold: true });
    await until(async () => finishBody !== undefined, 'the execution to enter the body');

    const noWait = await cli('acquire', LOCK, '--no-wait');
    expect(noWait.code).toBe(3);
    expect(noWait.stderr).toBe(`cdk-sfn-semaphore: ${LOCK}: no permit free (1 of 1 held)`);
    const shortWait = await cli('acquire', LOCK, '--wait', '1s');
    expect(shortWait.code).toBe(3);
    expect(shortWait.stderr).toBe(`cdk-sfn-semaphore: ${LOCK}: no permit free within 1s (1 of 1 held)`);

    const status = await cli('status', LOCK);
    expect(status.stdout.split('\n')[0]).toBe(`${LOCK}: 1 of 1 permits in use`);
    expect(status.stdout).toMatch(/^execution\s+arn:aws:states:.*:execution:.*\s+\d+s\s+-$/m);

    const waiting = binary('acquire', LOCK, '--wait', '30s');
    await new Promise((r) => setTimeout(r, 500));
    finishBody!();
    finishBody = undefined;
    const got = await waiting.done;
    expect(got.code).toBe(0);
    await execution.done;
    expect(execution.status).toBe('SUCCEEDED');
    expect((await cli('release', LOCK, got.stdout.trim())).code).toBe(0);
  });
});

describe('run', () => {
  test('exits with the command\'s code and gives the permit back', async () => {
    const result = await binary('run', LOCK, '--', process.execPath, '-e', 'process.exit(7)').done;
    expect(result.code).toBe(7);
  });

  test('SIGTERM reaches the command, the permit comes back, the exit code says which signal', async () => {
    // The command does not handle SIGTERM: it dies of it, and the CLI exits 128 + 15.
    const run = binary('run', LOCK, '--lease', '1m', '--', process.execPath, '-e', 'setInterval(() => {}, 1000)');
    await until(async () => (await client().status(LOCK)).holders.length === 1, 'the run to hold the permit');
    run.child.kill('SIGTERM');
    const result = await run.done;
    expect(result.code).toBe(143);
    expect(ownLines(result.stderr)).toEqual([]);
  });

  test('renewals keep a long command\'s permit past its lease; nobody reclaims it meanwhile', async () => {
    const run = binary('run', LOCK, '--lease', '2s', '--', process.execPath, '-e', 'setTimeout(() => {}, 6000)');
    await until(async () => (await client().status(LOCK)).holders.length === 1, 'the run to hold the permit');
    const first = (await client().status(LOCK)).holders[0];
    // A competitor that reclaims any lease the moment it ends (no clock-skew margin) tries for 5 s.
    const competitor = await client(0).acquire(LOCK, { waitSeconds: 5, limit: 1, pollSeconds: 0.2 });
    expect(competitor).toBeUndefined();
    const later = (await client().status(LOCK)).holders[0];
    expect(later.id).toBe(first.id);
    expect(later.ageSeconds).toBeGreaterThanOrEqual(4);
    expect(later.leaseExpiresAt!).toBeGreaterThan(first.leaseExpiresAt! + 2000);
    expect((await run.done).code).toBe(0);
  });
});

describe('leases', () => {
  test('an expired lease is reclaimed by an acquirer, but only once the clock-skew margin has passed too', async () => {
    const stale = await client().acquire(LOCK, { leaseSeconds: 1, limit: 1 });
    expect(stale).toBeDefined();
    await new Promise((r) => setTimeout(r, 1500));

    // Ended, but within the default 30 s margin: still held.
    expect(await client().acquire(LOCK, { limit: 1 })).toBeUndefined();
    const status = await cli('status', LOCK);
    expect(status.stdout).toMatch(/ended \d+s ago/);

    const fresh = await client(1).acquire(LOCK, { limit: 1, pollSeconds: 0.2, waitSeconds: 5 });
    expect(fresh).toBeDefined();
    const holders = (await client().status(LOCK)).holders.map((h) => h.id);
    expect(holders).toEqual([fresh!.leaseId]);
    // The stale holder learns it lost the permit.
    expect((await cli('renew', LOCK, stale!.leaseId)).code).toBe(3);
    expect((await cli('release', LOCK, stale!.leaseId)).code).toBe(3);
    expect(await client().release(LOCK, fresh!.leaseId)).toBe(true);
  });

  test('the reconciler sweeps an expired CLI lease and leaves a live one alone', async () => {
    // The reconciler runs on the simulation's clock, 100 times faster than this test's: a lease of a
    // second has long expired (30 s margin included) for it, one of a day has not.
    const stale = await client().acquire(LOCK, { leaseSeconds: 1, limit: 2, owner: 'crashed-job' });
    const live = await client().acquire(LOCK, { leaseSeconds: 86_400, limit: 2 });
    await sim.sleep(60);
    const result = (await sim.invokeFunction('WorkflowReconcilerFunction', {})) as { reclaimed: Array<{ holder: string; reason: string }> };
    expect(result.reclaimed).toEqual([{ lockName: LOCK, holder: stale!.leaseId, reason: expect.stringMatching(/^lease expired at /) }]);
    expect((await client().status(LOCK)).holders.map((h) => h.id)).toEqual([live!.leaseId]);
    expect(await client().release(LOCK, live!.leaseId)).toBe(true);
  });

  test('renew extends the lease; the new end is printed', async () => {
    const lease = await client().acquire(LOCK, { leaseSeconds: 60 });
    const renewed = await cli('renew', LOCK, lease!.leaseId, '--lease', '2h');
    expect(renewed.code).toBe(0);
    const end = Date.parse(renewed.stdout);
    expect(end).toBeGreaterThan(Date.now() + 7_100_000);
    expect((await client().status(LOCK)).holders[0].leaseExpiresAt).toBe(end);
    expect((await cli('release', LOCK, lease!.leaseId)).code).toBe(0);
  });

  test('force-release frees anyone\'s permit and says why', async () => {
    const lease = await client().acquire(LOCK, {});
    const noReason = await cli('force-release', LOCK, lease!.leaseId);
    expect([noReason.code, noReason.stderr]).toEqual([2, 'cdk-sfn-semaphore: force-release: --reason TEXT is required']);
    const forced = await cli('force-release', LOCK, lease!.leaseId, '--reason', 'script crashed');
    expect([forced.code, forced.stderr]).toEqual([0, `cdk-sfn-semaphore: ${LOCK}: released ${lease!.leaseId} by force: script crashed`]);
    expect((await cli('force-release', LOCK, lease!.leaseId, '--reason', 'again')).code).toBe(3);
  });
});

describe('usage and errors', () => {
  test.each(['acquire', 'renew', 'release', 'run', 'status', 'force-release'])('%s --help', async (command) => {
    const help = await cli(command, '--help');
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(new RegExp(`^Usage: cdk-sfn-semaphore ${command} LOCK`));
    expect(help.stdout).toContain('AWS_ENDPOINT_URL_DYNAMODB');
  });

  test.each<[string[], number, string | RegExp]>([
    [[], 2, /^$/],
    [['lock'], 2, "cdk-sfn-semaphore: unknown command 'lock' (acquire, renew, release, run, status, force-release; see --help)"],
    [['acquire'], 2, 'cdk-sfn-semaphore: acquire: expected LOCK, got nothing (see cdk-sfn-semaphore acquire --help)'],
    [['acquire', LOCK, '--lease', 'soon'], 2, "cdk-sfn-semaphore: acquire: --lease must be a duration such as 90s, 15m or 2h (more than 0), got: 'soon'"],
    [['acquire', LOCK, '--limit', '0'], 2, "cdk-sfn-semaphore: acquire: --limit must be a positive integer, got: '0'"],
    [['acquire', LOCK, '--wait', '5s', '--no-wait'], 2, 'cdk-sfn-semaphore: acquire: --wait and --no-wait exclude each other'],
    [['acquire', LOCK, '--colour'], 2, /^cdk-sfn-semaphore: acquire: Unknown option '--colour'/],
    [['run', LOCK], 2, "cdk-sfn-semaphore: run: no command after '--' (see cdk-sfn-semaphore run --help)"],
    [['release', LOCK, 'lease-nobody'], 3, `cdk-sfn-semaphore: ${LOCK}: lease-nobody holds no permit`],
    [['status', LOCK, '--table', 'no-such-table'], 1, /^cdk-sfn-semaphore: ResourceNotFoundException: /],
  ])('%j exits %i', async (argv, code, message) => {
    const result = await cli(...argv);
    expect(result.code).toBe(code);
    if (typeof message === 'string') expect(result.stderr).toBe(message);
    else expect(result.stderr).toMatch(message);
    expect(result.stderr.split('\n')).toHaveLength(1);
  });

  test('no table: a usage error naming the flag and the variable', async () => {
    const out: string[] = [];
    const code = await main(['status', LOCK], { stdout: () => undefined, stderr: (l) => out.push(l), env: {} });
    expect([code, out]).toEqual([2, ['cdk-sfn-semaphore: status: no table: pass --table NAME or set CDK_SFN_SEMAPHORE_TABLE']]);
  });

  test('durations', () => {
    expect([parseDuration('90'), parseDuration('90s'), parseDuration('15m'), parseDuration('2h'), parseDuration('1d'), parseDuration('500ms')]).toEqual([90, 90, 900, 7200, 86400, 0.5]);
    expect(parseDuration('1 hour')).toBeUndefined();
  });
});

let stateMachine: ReturnType<typeof workflowStack>['workflow']['stateMachine'] | undefined;
function workflowStateMachine() {
  // The simulator was started from this same app: find the workflow's state machine by its logical ID.
  stateMachine ??= workflowStack({ concurrencyLimit: 1 }).workflow.stateMachine;
  return stateMachine;
}
