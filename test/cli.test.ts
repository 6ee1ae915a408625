import { ChildProcess, spawn } from 'child_process';
import * as fs from 'fs';
import * as http from 'http';
import * as os from 'os';
import * as path from 'path';
import { DeleteItemCommand, DynamoDBClient, GetItemCommand, PutItemCommand, UpdateItemCommand } from '@aws-sdk/client-dynamodb';
import { SendTaskSuccessCommand, SFNClient } from '@aws-sdk/client-sfn';
import { stateMachineLogicalId, until, WorkTracker, workflowStack } from './helpers';
import { defaultOwner, main, parseDuration } from '../client/cli';
import { Flow, runFlow } from '../client/effects';
import {
  abandonCollecting,
  acquireAttempt,
  COLLECTOR_LEASE_SECONDS,
  completeCollecting,
  HOLDER_OWNER,
  registerCollector,
  SemaphoreClient,
  shouldCollect,
} from '../client/semaphore-client';
import { Execution, Simulator } from '../simulator';
import {
  DELETE_SERVED_CONDITION,
  HAND_OFF_UPDATE,
  HOLDER_ACQUIRED_AT,
  HOLDER_COLLECTING,
  HOLDER_EXTRA_PERMITS,
  HOLDER_IN_BODY,
  HOLDER_LEASE_EXPIRES_AT,
  HOLDER_LEASE_SECONDS,
  HOLDER_PERMITS,
  HOLDER_REDRIVE_COUNT,
  PEEK_UPDATE,
  RELEASE_UPDATE,
  SERVE_TICKET_UPDATE,
  TICKET_WAIT_TOKEN,
  TICKET_WAITER,
  ticketKey,
} from '../src/private/lock-schema';

/*
 * The CLI and the client against dynalite, on the very lock item a workflow executing in the simulator
 * uses. The CLI runs as the package's bin (the esbuild bundle the test command builds first) where
 * processes and signals matter, in process elsewhere. Simulated time runs 100 times faster than the
 * CLI's real time. Where DynamoDB has to fail, the bin talks to it through a proxy that drops the
 * connections of the calls we choose.
 */

const BIN = path.resolve(__dirname, '..', 'assets', 'client', 'cli', 'cdk-sfn-semaphore.js');
const LOCK = 'TestStack/Workflow';
const EXECUTION_ARN = 'arn:aws:states:us-east-1:123456789012:execution:Workflow:run-1';

let sim: Simulator;
let table: string;
let env: NodeJS.ProcessEnv;
let work: WorkTracker;
/** Resolves the body of the execution that is inside. */
let finishBody: (() => void) | undefined;
/** Marker files of the commands that `run` starts. */
let tmp: string;
/** Every process a test started (CLIs, and the commands and children they wrote pid files for): afterAll kills what is left. */
const spawned: ChildProcess[] = [];
const pids: number[] = [];
let proxy: FaultyProxy;

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
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'cli-test-'));
  proxy = await FaultyProxy.start(sim.db.endpoint);
});

afterAll(async () => {
  for (const child of spawned) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  for (const pid of pids) if (alive(pid)) process.kill(pid, 'SIGKILL');
  await proxy?.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
  await sim.stop();
});

/** A plain DynamoDB client of the simulation's table. */
function plainClient() {
  return new DynamoDBClient({ endpoint: sim.db.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'local', secretAccessKey: 'local' } });
}

/** `flow` with its clock `offsetMs` away from now. */
function* atClock<T>(offsetMs: number, flow: Flow<T>): Flow<T> {
  let step = flow.next();
  while (!step.done) {
    if (step.value.service === 'clock') {
      step = flow.next(Date.now() + offsetMs);
      continue;
    }
    let answer: unknown;
    try {
      answer = yield step.value;
    } catch (e) {
      step = flow.throw(e);
      continue;
    }
    step = flow.next(answer);
  }
  return step.value;
}

function client(clockSkewSeconds?: number) {
  return new SemaphoreClient({
    tableName: table,
    clockSkewSeconds,
    dynamodb: new DynamoDBClient({ endpoint: sim.db.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'local', secretAccessKey: 'local' } }),
  });
}

/** The CLI in this process: exit code and what it wrote. */
async function cli(...argv: string[]) {
  return cliWith({}, ...argv);
}

/** The CLI in this process, with more environment variables. */
async function cliWith(moreEnv: NodeJS.ProcessEnv, ...argv: string[]) {
  const out: string[] = [];
  const err: string[] = [];
  const code = await main(argv, { stdout: (l) => out.push(l), stderr: (l) => err.push(l), env: { ...env, ...moreEnv } });
  return { code, stdout: out.join('\n'), stderr: err.join('\n') };
}

interface Exited {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * The CLI as a process (the bin), with its output collected: `done` once its output has ended too,
 * `exited` as soon as it has exited; `stderr()` is what it wrote so far.
 */
function binary(...argv: string[]) {
  return binaryWith({}, ...argv);
}

function binaryWith(moreEnv: NodeJS.ProcessEnv, ...argv: string[]) {
  const child = spawn(process.execPath, [BIN, ...argv], { env: { ...env, ...moreEnv } });
  spawned.push(child);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d) => (stdout += d));
  child.stderr!.on('data', (d) => (stderr += d));
  const done = new Promise<Exited>((resolve) => child.on('close', (code, signal) => resolve({ code: code ?? (signal ? -1 : null), stdout, stderr })));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code, signal) => resolve(code ?? (signal ? -1 : null))));
  return { child, done, exited, stderr: () => stderr };
}

/** A fresh marker file for a command to write its pid to. */
let markers = 0;
function marker(): string {
  return path.join(tmp, `marker-${++markers}`);
}

/** The pid a command wrote to `file`, once it did; remembered for afterAll. */
async function pidIn(file: string): Promise<number> {
  await until(async () => fs.existsSync(file) && /^\d+\s*$/.test(fs.readFileSync(file, 'utf8')), `a pid in ${path.basename(file)}`);
  const pid = Number(fs.readFileSync(file, 'utf8').trim());
  pids.push(pid);
  return pid;
}

/** A node command that writes its pid to `file`, then runs until killed; with `ignoreTerm`, SIGTERM does not stop it. */
function longCommand(file: string, ignoreTerm = false): string[] {
  const trap = ignoreTerm ? "process.on('SIGTERM', () => {});" : '';
  return [process.execPath, '-e', `${trap} require('fs').writeFileSync(${JSON.stringify(file)}, String(process.pid)); setInterval(() => {}, 1000);`];
}

/** Whether a process runs (a zombie does not: nobody may be there to reap it). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    return !/^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}


/**
 * A DynamoDB endpoint in front of dynalite that drops the connection of renewals (`SET holder.<lease end>`)
 * or releases (`REMOVE holder`, conditional on the holder) while told to, as a network that is down; and
 * of a client's acquires, either before they reach dynalite or after (the write lands, its response is
 * lost), as many times as told.
 */
class FaultyProxy {
  public static async start(target: string): Promise<FaultyProxy> {
    const started = new FaultyProxy(new URL(target));
    await new Promise<void>((resolve) => started.server.listen(0, '127.0.0.1', resolve));
    return started;
  }

  public readonly fail = { renew: false, release: false };
  public readonly dropped = { renew: 0, release: 0 };
  /** How many acquires to drop before they reach dynalite, and how many responses of acquires that did. */
  public readonly acquireFaults = { beforeWrite: 0, afterWrite: 0 };
  private readonly server: http.Server;

  private constructor(target: URL) {
    this.server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        const call = String(req.headers['x-amz-target']).endsWith('.UpdateItem') ? (JSON.parse(body.toString()) as Record<string, string>) : {};
        const kind = call.UpdateExpression?.startsWith(`SET #holder.${HOLDER_LEASE_EXPIRES_AT}`)
          ? 'renew'
          : call.UpdateExpression?.includes('REMOVE #holder') && call.ConditionExpression?.startsWith('attribute_exists(#holder)')
            ? 'release'
            : undefined;
        if (kind && this.fail[kind]) {
          this.dropped[kind]++;
          req.socket.destroy();
          return;
        }
        const acquire = call.UpdateExpression?.startsWith('SET #permits = if_not_exists(#permits, :zero) + :one, #holder = :entry');
        if (acquire && this.acquireFaults.beforeWrite > 0) {
          this.acquireFaults.beforeWrite--;
          req.socket.destroy();
          return;
        }
        const loseResponse = acquire && this.acquireFaults.afterWrite > 0;
        if (loseResponse) this.acquireFaults.afterWrite--;
        const upstream = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers }, (up) => {
          if (loseResponse) {
            up.resume();
            up.on('end', () => req.socket.destroy());
            return;
          }
          res.writeHead(up.statusCode!, up.headers);
          up.pipe(res);
        });
        upstream.on('error', () => res.destroy());
        upstream.end(body);
      });
    });
  }

  public get endpoint(): string {
    return `http://127.0.0.1:${(this.server.address() as { port: number }).port}`;
  }

  public stop(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

afterEach(async () => {
  proxy.fail.renew = false;
  proxy.fail.release = false;
  proxy.acquireFaults.beforeWrite = proxy.acquireFaults.afterWrite = 0;
  // Every test leaves the lock free.
  const status = await client().status(LOCK);
  expect(status.holders).toEqual([]);
  expect(status.permitsInUse).toBe(0);
});

/** Starts an execution whose body waits for finishBody, and resolves once it is inside (holding the permit). */
async function executionInside() {
  const execution = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { hold: true });
  await until(async () => finishBody !== undefined, 'the execution to enter the body');
  return execution;
}

/** Whether a wait of the execution in the queue ended because it was woken (SendTaskSuccess), rather than by its timeout. */
function wokenInQueue(execution: Execution): boolean {
  return execution.history.some((h) => h.type === 'TaskSucceeded' && ['Wait In Queue', 'Wait In Queue Again'].includes(h.state ?? ''));
}

async function finishExecution(execution: Awaited<ReturnType<typeof executionInside>>) {
  finishBody!();
  finishBody = undefined;
  await execution.done;
  expect(execution.status).toBe('SUCCEEDED');
}

describe('CLI holders and workflow executions share one lock', () => {
  test('a CLI lease makes an execution wait in the queue; the CLI\'s release hands the permit over and wakes it', async () => {
    const acquired = await binary('acquire', LOCK, '--limit', '1', '--no-wait', '--owner', 'deploy-script').done;
    expect(acquired.code).toBe(0);
    const leaseId = acquired.stdout.trim();
    expect(leaseId).toMatch(/^lease-[0-9a-f-]{36}$/);

    const execution = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { n: 1 });
    // Once queued, half a second of real time is 50 s in the simulation: it sleeps there, without polling.
    await until(() => execution.stateTransitions.get('Wait In Queue') === 1, 'the execution queued');
    await new Promise((r) => setTimeout(r, 500));
    expect(execution.status).toBe('RUNNING');
    expect(execution.stateTransitions.get('Wait In Queue')).toBe(1);
    expect(execution.stateTransitions.has('Poll For Permit')).toBe(false);
    expect(work.byExecution.has(execution.arn)).toBe(false);

    const status = JSON.parse((await cli('status', LOCK, '--json')).stdout);
    expect(status).toMatchObject({
      lockName: LOCK,
      permitsInUse: 1,
      limit: 1,
      holders: [{ id: leaseId, kind: 'lease', owner: 'deploy-script', expired: false }],
      waiters: [execution.holderId],
    });
    expect((await cli('status', LOCK)).stdout.split('\n')[0]).toBe(`${LOCK}: 1 of 1 permits in use, 1 execution queued`);

    // The binary's release finds the waiter, moves the permit to it and wakes it (SendTaskSuccess to the
    // simulation's Step Functions API, through AWS_ENDPOINT_URL_SFN).
    expect((await binary('release', LOCK, leaseId).done).code).toBe(0);
    await execution.done;
    expect(execution.status).toBe('SUCCEEDED');
    expect(work.byExecution.get(execution.arn)).toBe(1);
    // Woken, not found by a timed-out wait: the permit went straight to it, and nothing else took it.
    // (A loaded machine may let a wait time out first, 3 s of real time: it then waits again, and is woken there.)
    expect(wokenInQueue(execution)).toBe(true);
    expect(execution.stateTransitions.has('Check Handed-Off Permit Again')).toBe(false);
    expect(execution.stateTransitions.has('Acquire Permit')).toBe(true);
  });

  test('a release that cannot wake the queued execution warns; the execution finds its permit when its wait times out', async () => {
    const acquired = await cli('acquire', LOCK, '--no-wait');
    expect(acquired.code).toBe(0);
    const execution = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { n: 2 });
    await until(async () => execution.stateTransitions.get('Wait In Queue') === 1, 'the execution to queue');

    // No Step Functions endpoint to be reached (as without states:SendTaskSuccess, or without a region).
    const released = await binaryWith({ AWS_ENDPOINT_URL_SFN: 'http://127.0.0.1:9' }, 'release', LOCK, acquired.stdout).done;
    expect(released.code).toBe(0);
    expect(released.stderr.trim()).toMatch(
      new RegExp(`^cdk-sfn-semaphore: ${LOCK}: warning: handed the permit to the queued execution ${execution.holderId} but could not wake it \\(.*\\); it finds the permit when its queueCheckInterval ends .*SemaphoreTable.grantClient\\)$`),
    );
    // Its wait times out (5 simulated minutes); it claims the permit handed to it and goes in, never woken.
    await execution.done;
    expect(execution.status).toBe('SUCCEEDED');
    expect(execution.stateTransitions.get('Poll For Permit Again')).toBeGreaterThanOrEqual(1);
    expect(execution.stateTransitions.get('Check Handed-Off Permit Again')).toBeGreaterThanOrEqual(1);
    expect(wokenInQueue(execution)).toBe(false);
  });

  test('an acquire whose write landed but whose response was lost finds its own lease and a fencing token', async () => {
    proxy.acquireFaults.afterWrite = 3; // every attempt the SDK makes
    const acquired = await binaryWith({ AWS_ENDPOINT_URL_DYNAMODB: proxy.endpoint }, 'acquire', LOCK, '--no-wait', '--json').done;
    expect([acquired.code, acquired.stderr]).toEqual([0, '']);
    expect(proxy.acquireFaults.afterWrite).toBe(0);
    const printed = JSON.parse(acquired.stdout);
    expect(printed.fencingToken).toEqual(expect.any(Number));
    expect(printed.lock).toBe(LOCK);
    const status = JSON.parse((await cli('status', LOCK, '--json')).stdout);
    expect(status.holders.map((h: { id: string }) => h.id)).toEqual([printed.leaseId]);
    expect((await cli('release', LOCK, printed.leaseId)).code).toBe(0);
  });

  test('an acquire that fails on the way tries again within its wait; without a wait it fails with exit 1', async () => {
    // More failures than the SDK's own attempts of one call: the acquire itself must try again.
    proxy.acquireFaults.beforeWrite = 6;
    const waited = await binaryWith({ AWS_ENDPOINT_URL_DYNAMODB: proxy.endpoint }, 'acquire', LOCK, '--wait', '20s').done;
    expect(waited.code).toBe(0);
    expect(waited.stderr.trim()).toMatch(new RegExp(`^cdk-sfn-semaphore: ${LOCK}: warning: acquiring failed \\(.*\\), trying again$`));
    expect(proxy.acquireFaults.beforeWrite).toBe(0);
    expect((await cli('release', LOCK, waited.stdout.trim())).code).toBe(0);

    proxy.acquireFaults.beforeWrite = 12;
    const once = await binaryWith({ AWS_ENDPOINT_URL_DYNAMODB: proxy.endpoint }, 'acquire', LOCK, '--no-wait').done;
    expect(once.code).toBe(1);
    // One call (with the SDK's own attempts), not one after the other.
    expect(proxy.acquireFaults.beforeWrite).toBeGreaterThan(0);
    expect(once.stderr.trim().split('\n')).toHaveLength(1);
    // It looked: nothing of it is left on the lock.
    expect(JSON.parse((await cli('status', LOCK, '--json')).stdout).holders).toEqual([]);
  });

  test('an acquire that is refused for good (no such table) fails at once, whatever its wait', async () => {
    const started = Date.now();
    const refused = await cli('acquire', LOCK, '--table', 'no-such-table', '--limit', '1', '--wait', '60s');
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^cdk-sfn-semaphore: ResourceNotFoundException: /);
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  test('an execution inside makes the CLI wait or give up with exit code 3, then get the permit', async () => {
    const execution = await executionInside();

    const noWait = await cli('acquire', LOCK, '--no-wait');
    expect(noWait.code).toBe(3);
    expect(noWait.stderr).toBe(`cdk-sfn-semaphore: ${LOCK}: no permit free (1 of 1 held)`);
    const shortWait = await cli('acquire', LOCK, '--wait', '1s');
    expect(shortWait.code).toBe(3);
    expect(shortWait.stderr.split('\n')).toEqual([
      `cdk-sfn-semaphore: ${LOCK}: 1 of 1 permits in use, waiting up to 1s`,
      `cdk-sfn-semaphore: ${LOCK}: no permit free within 1s (1 of 1 held)`,
    ]);

    const status = await cli('status', LOCK);
    expect(status.stdout.split('\n')[0]).toBe(`${LOCK}: 1 of 1 permits in use`);
    expect(status.stdout).toMatch(/^execution\s+[0-9a-f]{32}:exec-\d+\s+1\s+\d+s\s+-$/m);

    const waiting = binary('acquire', LOCK, '--wait', '30s');
    // It tried, found the lock full and waits: only now does the permit come free.
    await until(async () => waiting.stderr().includes('waiting up to 30s'), 'the CLI to find the lock full');
    await finishExecution(execution);
    const got = await waiting.done;
    expect(got.code).toBe(0);
    expect((await cli('release', LOCK, got.stdout.trim())).code).toBe(0);
  });

  test('a CLI acquire that waits on a lock whose executions queue goes next: the permit given back goes to it, then the queue moves on', async () => {
    const first = await executionInside();
    const queued = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { n: 3 });
    await until(() => queued.stateTransitions.get('Wait In Queue') === 1, 'the execution queued');
    const out: string[] = [];
    const err: string[] = [];
    const waiting = main(['acquire', LOCK, '--wait', '60s', '--owner', 'ci-job'], { stdout: (l) => out.push(l), stderr: (l) => err.push(l), env });
    await until(() => err.length > 0, 'the CLI to say that it waits');
    expect(err).toEqual([
      `cdk-sfn-semaphore: ${LOCK}: 1 of 1 permits in use, waiting up to 60s, next in line (executions are queued: the permits given back go to it first)`,
    ]);
    const registered = await client().status(LOCK);
    expect(registered).toMatchObject({ permitsInUse: 1, waiters: [queued.holderId] });
    expect(registered.holders.find((h) => h.kind === 'lease')).toMatchObject({ owner: 'ci-job', permits: 0, collecting: true });
    expect((await cli('status', LOCK)).stdout).toMatch(/^lease\s+lease-[0-9a-f-]{36}\s+0 \(next: collecting\)\s+ci-job\s/m);

    // The execution inside gives its permit back (the collector is short of it) rather than hand it on.
    await finishExecution(first);
    expect(await waiting).toBe(0);
    expect(err).toHaveLength(1);
    const leaseId = out.join('\n').trim();
    const held = await client().status(LOCK);
    expect(held.holders).toEqual([expect.objectContaining({ id: leaseId, kind: 'lease', owner: 'ci-job', permits: 1 })]);
    expect(held.holders[0].collecting).toBeUndefined();
    // The queued execution still sleeps, its body not run: the permit went to the CLI.
    expect(held.waiters).toEqual([queued.holderId]);
    expect(queued.status).toBe('RUNNING');
    expect(work.byExecution.has(queued.arn)).toBe(false);

    // The CLI's release hands the permit to it.
    expect((await cli('release', LOCK, leaseId)).code).toBe(0);
    await queued.done;
    expect(queued.status).toBe('SUCCEEDED');
    expect(work.byExecution.get(queued.arn)).toBe(1);
  });

  test('a CLI that began to wait before executions queued says so when it goes next', async () => {
    const first = await executionInside();
    const err: string[] = [];
    const out: string[] = [];
    const waiting = main(['acquire', LOCK, '--wait', '60s'], { stdout: (l) => out.push(l), stderr: (l) => err.push(l), env });
    await until(() => err.length > 0, 'the CLI to say that it waits');
    expect(err).toEqual([`cdk-sfn-semaphore: ${LOCK}: 1 of 1 permits in use, waiting up to 60s`]);
    const queued = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { n: 4 });
    await until(() => err.length > 1, 'the CLI to go next once the execution queued');
    expect(err[1]).toBe(`cdk-sfn-semaphore: ${LOCK}: 1 of 1 permits in use, still waiting, next in line (executions are queued: the permits given back go to it first)`);
    await finishExecution(first);
    expect(await waiting).toBe(0);
    // Said once: its later looks as the collector add nothing.
    expect(err).toHaveLength(2);
    expect((await cli('release', LOCK, out.join('\n').trim())).code).toBe(0);
    await queued.done;
    expect(queued.status).toBe('SUCCEEDED');
  });

  test('a CLI that waits next in line gives its place up when its wait ends or a signal ends it; the queue then moves on as before', async () => {
    const first = await executionInside();
    const queued = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { n: 6 });
    await until(() => queued.stateTransitions.get('Wait In Queue') === 1, 'the execution queued');
    const collectors = async () => (await client().status(LOCK)).holders.filter((h) => h.collecting);

    const timedOut = await cli('acquire', LOCK, '--wait', '1s');
    expect(timedOut.code).toBe(3);
    expect(timedOut.stderr).toMatch(/next in line/);
    expect(await collectors()).toEqual([]);

    const waiting = binary('acquire', LOCK, '--wait', '60s');
    await until(async () => waiting.stderr().includes('next in line'), 'the CLI to wait next in line');
    expect(await collectors()).toHaveLength(1);
    waiting.child.kill('SIGTERM');
    const ended = await waiting.done;
    expect(ended.code).toBe(128 + os.constants.signals.SIGTERM);
    expect(ended.stderr).toMatch(/interrupted \(SIGTERM\) while waiting for a permit/);
    expect(await collectors()).toEqual([]);
    expect((await client().status(LOCK)).permitsInUse).toBe(1);

    // Nobody collects: the release hands the permit to the queued execution.
    await finishExecution(first);
    await queued.done;
    expect(queued.status).toBe('SUCCEEDED');
  });

  test('a collector that stops waiting gives its place up: the permit given back to it meanwhile goes to the queue', async () => {
    const protocol = { tableName: table, clockSkewMs: 0 };
    const clients = { dynamodb: plainClient(), stepFunctions: new SFNClient({ endpoint: sim.sfnApi!.endpoint, maxAttempts: 1 }) };
    const first = await executionInside();
    const queued = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { n: 4 });
    await until(() => queued.stateTransitions.get('Wait In Queue') === 1, 'the execution queued');
    expect(await runFlow(registerCollector(protocol, LOCK, 'lease-gives-up', { limit: 1 }), clients)).toBe(true);
    // A second client finds a collector there: it polls, as before.
    expect(await runFlow(registerCollector(protocol, LOCK, 'lease-second', { limit: 1 }), clients)).toBe(false);
    await finishExecution(first);
    expect(await client().status(LOCK)).toMatchObject({ permitsInUse: 0, waiters: [queued.holderId] });
    expect(queued.status).toBe('RUNNING');

    // Its release serves the queue: the free permit is handed to the waiter, which is woken (or, had the
    // waiter's check come in between, its ticket is passed: it took the permit itself).
    const served = await runFlow(abandonCollecting(protocol, LOCK, 'lease-gives-up'), clients);
    expect(served!.removed + served!.admitted).toBe(1);
    await queued.done;
    expect(queued.status).toBe('SUCCEEDED');
    expect(await runFlow(abandonCollecting(protocol, LOCK, 'lease-gives-up'), clients)).toBeUndefined();
  });

  test('a collector that crashed holds the queue up only until its registration expires: an acquirer reclaims it and serves the queue', async () => {
    const protocol = { tableName: table, clockSkewMs: 0 };
    const clients = { dynamodb: plainClient(), stepFunctions: new SFNClient({ endpoint: sim.sfnApi!.endpoint, maxAttempts: 1 }) };
    const first = await executionInside();
    const queued = sim.startExecution(sim.stateMachine(stateMachineLogicalId(workflowStateMachine())), { n: 5 });
    await until(() => queued.stateTransitions.get('Wait In Queue') === 1, 'the execution queued');
    // Registered long enough ago that its registration has expired, and never heard of again.
    const ago = -(COLLECTOR_LEASE_SECONDS + 1) * 1000;
    expect(await runFlow(atClock(ago, registerCollector(protocol, LOCK, 'lease-crashed', { limit: 1 })), clients)).toBe(true);
    await finishExecution(first);
    expect(await client().status(LOCK)).toMatchObject({ permitsInUse: 0, waiters: [queued.holderId] });

    const tried = await cliWith({ CDK_SFN_SEMAPHORE_CLOCK_SKEW: '0s' }, 'acquire', LOCK, '--no-wait');
    // The permit went to the queue's waiter, first in line, not to the acquirer that freed it (which
    // may get one once that execution has finished, and holds it until released below: had it taken
    // the one freed, the execution would never finish).
    await queued.done;
    expect(queued.status).toBe('SUCCEEDED');
    expect([0, 3]).toContain(tried.code);
    if (tried.code === 0) expect((await cli('release', LOCK, tried.stdout.trim())).code).toBe(0);
  });

  test('--limit cannot raise the workflows\' limit: the lock\'s applies, with a warning, and stays', async () => {
    const warning = `cdk-sfn-semaphore: ${LOCK}: warning: the lock's limit is 1; --limit 5 cannot raise it`;
    const execution = await executionInside();
    const full = await cli('acquire', LOCK, '--limit', '5', '--no-wait');
    expect(full.code).toBe(3);
    expect(full.stderr.split('\n')).toEqual([warning, `cdk-sfn-semaphore: ${LOCK}: no permit free (1 of 1 held)`]);
    expect(JSON.parse((await cli('status', LOCK, '--json')).stdout)).toMatchObject({ permitsInUse: 1, limit: 1 });
    await finishExecution(execution);

    // On a free lock it gets in, but does not record its limit: a second one stays out.
    const first = await cli('acquire', LOCK, '--limit', '5', '--no-wait');
    expect([first.code, first.stderr]).toEqual([0, warning]);
    expect(JSON.parse((await cli('status', LOCK, '--json')).stdout)).toMatchObject({ permitsInUse: 1, limit: 1 });
    const second = await cli('acquire', LOCK, '--limit', '5', '--no-wait');
    expect(second.code).toBe(3);
    // A lower limit of its own applies: the lock's does not raise it either.
    expect((await client().acquire(LOCK, { limit: 1 }))).toBeUndefined();
    expect((await cli('release', LOCK, first.stdout)).code).toBe(0);
  });
});

describe('run', () => {
  test('exits with the command\'s code and gives the permit back', async () => {
    const result = await binary('run', LOCK, '--', process.execPath, '-e', 'process.exit(7)').done;
    expect(result.code).toBe(7);
    expect(result.stderr).toBe('');
  });

  test('SIGTERM reaches the command, the permit comes back, the exit code says which signal', async () => {
    // The command does not handle SIGTERM: it dies of it, and the CLI exits 128 + 15.
    const file = marker();
    const run = binary('run', LOCK, '--lease', '1m', '--', ...longCommand(file));
    const pid = await pidIn(file);
    run.child.kill('SIGTERM');
    const result = await run.done;
    expect(result.code).toBe(143);
    // Nothing else on stderr: not even the AWS SDK's warning about Node versions.
    expect(result.stderr).toBe('');
    expect(alive(pid)).toBe(false);
  });

  test('the command runs in a process group of its own: a signal reaches its children too', async () => {
    const file = marker();
    const run = binary('run', LOCK, '--', 'sh', '-c', `sleep 60 & echo $! > ${file}; wait`);
    const grandchild = await pidIn(file);
    run.child.kill('SIGTERM');
    // Not `done`: a surviving child would keep the CLI's stdout open.
    expect(await run.exited).toBe(143);
    await until(async () => !alive(grandchild), 'the command\'s child to end', 3000);
    expect((await run.done).stderr).toBe('');
  });

  test('renewals keep a long command\'s permit past its lease; nobody reclaims it meanwhile', async () => {
    const file = marker();
    const run = binary('run', LOCK, '--lease', '10s', '--', ...longCommand(file));
    await pidIn(file);
    const first = (await client().status(LOCK)).holders[0];
    // A competitor that reclaims any lease the moment it ends (no clock-skew margin) tries until past its first end.
    const competitor = await client(0).acquire(LOCK, { waitSeconds: (first.leaseExpiresAt! - Date.now()) / 1000 + 0.5, limit: 1, pollSeconds: 0.5 });
    expect(competitor).toBeUndefined();
    const later = (await client().status(LOCK)).holders[0];
    expect(later.id).toBe(first.id);
    expect(later.ageSeconds).toBeGreaterThanOrEqual(10);
    expect(later.leaseExpiresAt!).toBeGreaterThan(first.leaseExpiresAt! + 6000);
    run.child.kill('SIGTERM');
    const result = await run.done;
    expect([result.code, result.stderr]).toEqual([143, '']);
  });

  test('a lost permit stops a command that ignores SIGTERM: SIGKILL after the grace period, exit 3', async () => {
    const file = marker();
    const run = binary('run', LOCK, '--lease', '10s', '--', ...longCommand(file, true));
    const pid = await pidIn(file);
    const [holder] = (await client().status(LOCK)).holders;
    const lostAt = Date.now();
    expect(await client().forceRelease(LOCK, holder.id)).toBe(true);
    const result = await run.done;
    // The next renewal (a third of the lease) finds it gone; SIGKILL follows a third of the lease later.
    const took = Date.now() - lostAt;
    expect(took).toBeGreaterThan(3000);
    expect(took).toBeLessThan(9000);
    expect(result.code).toBe(3);
    expect(result.stderr.trim().split('\n')).toEqual([
      `cdk-sfn-semaphore: ${LOCK}: the permit of ${holder.id} is gone (force-released, or reclaimed after its lease expired): ` +
        'stopping the command (SIGTERM, then SIGKILL after 3.3s)',
    ]);
    expect(alive(pid)).toBe(false);
  });

  test('renewals that fail until the lease has ended lose the permit too: the command is stopped, exit 3', async () => {
    proxy.fail.renew = true;
    const file = marker();
    const run = binaryWith({ AWS_ENDPOINT_URL_DYNAMODB: proxy.endpoint }, 'run', LOCK, '--lease', '10s', '--', ...longCommand(file, true));
    const pid = await pidIn(file);
    const [holder] = (await client().status(LOCK)).holders;
    const result = await run.done;
    expect(result.code).toBe(3);
    const lines = result.stderr.trim().split('\n');
    expect(lines.length).toBeGreaterThanOrEqual(3);
    for (const line of lines.slice(0, -1)) expect(line).toMatch(new RegExp(`^cdk-sfn-semaphore: ${LOCK}: renewing ${holder.id} failed, retrying \\(the lease ends at `));
    expect(lines[lines.length - 1]).toMatch(new RegExp(`^cdk-sfn-semaphore: ${LOCK}: renewals of ${holder.id} failed until its lease ended at .*, it may be reclaimed: stopping the command`));
    expect(proxy.dropped.renew).toBeGreaterThanOrEqual(2);
    expect(alive(pid)).toBe(false);
    // The release went through: afterEach finds the lock free.
  });

  test('a release that keeps failing is retried, then a warning: the exit code stays the command\'s', async () => {
    proxy.fail.release = true;
    const dropped = proxy.dropped.release;
    const result = await binaryWith({ AWS_ENDPOINT_URL_DYNAMODB: proxy.endpoint }, 'run', LOCK, '--', process.execPath, '-e', 'process.exit(5)').done;
    expect(result.code).toBe(5);
    const [holder] = (await client().status(LOCK)).holders;
    expect(result.stderr.trim()).toMatch(
      new RegExp(`^cdk-sfn-semaphore: ${LOCK}: warning: could not give the permit of ${holder.id} back \\(.*\\); it is free again once its lease has ended, at `),
    );
    // Four attempts, each retried by the SDK.
    expect(proxy.dropped.release - dropped).toBeGreaterThanOrEqual(4);
    expect(await client().release(LOCK, holder.id)).toBe(true);
  });

  test('--stripes K: the permit of a stripe drawn at random, named to the command in $CDK_SFN_SEMAPHORE_LOCK', async () => {
    const seen = new Set<string>();
    for (let i = 0; i < 12; i++) {
      const file = marker();
      const result = await cli('run', 'striped', '--stripes', '3', '--', 'sh', '-c', `printf %s "$CDK_SFN_SEMAPHORE_LOCK" > ${file}`);
      expect(result).toEqual({ code: 0, stdout: '', stderr: '' });
      seen.add(fs.readFileSync(file, 'utf8'));
    }
    // Only the stripes, more than one of them (all 12 on one: 3 in 3^12), each given back.
    for (const lock of seen) expect(lock).toMatch(/^striped#[0-2]$/);
    expect(seen.size).toBeGreaterThan(1);
    for (const lock of seen) expect((await client().status(lock)).permitsInUse).toBe(0);

    // One stripe is the lock itself; a count a workflow could not have is refused.
    const file = marker();
    expect((await cli('run', 'whole', '--stripes', '1', '--', 'sh', '-c', `printf %s "$CDK_SFN_SEMAPHORE_LOCK" > ${file}`)).code).toBe(0);
    expect(fs.readFileSync(file, 'utf8')).toBe('whole');
    for (const bad of ['0', '101', '2.5', 'many']) {
      expect(await cli('run', 'striped', '--stripes', bad, '--', 'true')).toEqual({
        code: 2,
        stdout: '',
        stderr: `cdk-sfn-semaphore: run: --stripes must be an integer from 1 to 100 (as a workflow's lockStripes), got: '${bad}'`,
      });
    }
  });

  test('acquire --stripes K: the permit of a stripe drawn at random, printed with its lock as renew and release take them', async () => {
    const leases: Array<[string, string]> = [];
    for (let i = 0; i < 12; i++) {
      const result = await cli('acquire', 'split', '--stripes', '3', '--limit', '12', '--no-wait');
      expect([result.code, result.stderr]).toEqual([0, '']);
      const [lock, leaseId, ...rest] = result.stdout.trim().split(' ');
      expect([lock, leaseId, rest]).toEqual([expect.stringMatching(/^split#[0-2]$/), expect.stringMatching(/^lease-[0-9a-f-]{36}$/), []]);
      leases.push([lock, leaseId]);
    }
    // More than one stripe drawn (all 12 on one: 3 in 3^12), each lease held on the stripe printed.
    const locks = [...new Set(leases.map(([lock]) => lock))];
    expect(locks.length).toBeGreaterThan(1);
    for (const lock of locks) {
      expect((await client().status(lock)).holders.map((h) => h.id).sort()).toEqual(leases.filter(([l]) => l === lock).map(([, id]) => id).sort());
    }
    const [[lock, leaseId]] = leases;
    expect((await cli('renew', lock, leaseId)).code).toBe(0);
    for (const [l, id] of leases) expect((await cli('release', l, id)).code).toBe(0);
    for (const l of locks) expect((await client().status(l)).permitsInUse).toBe(0);

    // --json names the stripe too; --stripes 1 is the lock itself, still printed with it; bad counts are refused.
    const json = JSON.parse((await cli('acquire', 'split', '--stripes', '2', '--json')).stdout);
    expect(json).toEqual({ lock: expect.stringMatching(/^split#[01]$/), leaseId: expect.any(String), fencingToken: expect.any(Number), expiresAt: expect.any(String) });
    expect((await cli('release', json.lock, json.leaseId)).code).toBe(0);
    const whole = await cli('acquire', 'entire', '--stripes', '1');
    expect(whole.stdout).toMatch(/^entire lease-[0-9a-f-]{36}\n?$/);
    expect((await cli('release', ...whole.stdout.trim().split(' '))).code).toBe(0);
    for (const bad of ['0', '101', 'x']) {
      expect(await cli('acquire', 'split', '--stripes', bad)).toEqual({
        code: 2,
        stdout: '',
        stderr: `cdk-sfn-semaphore: acquire: --stripes must be an integer from 1 to 100 (as a workflow's lockStripes), got: '${bad}'`,
      });
    }
  });

  test('a command that cannot start: exit 1, and the permit comes back', async () => {
    const result = await binary('run', LOCK, '--', path.join(tmp, 'no-such-command')).done;
    expect(result.code).toBe(1);
    expect(result.stderr.trim()).toBe(`cdk-sfn-semaphore: run: cannot start '${path.join(tmp, 'no-such-command')}': spawn ${path.join(tmp, 'no-such-command')} ENOENT`);
  });

  test('a signal while waiting for a permit ends the wait: exit 128 + its number', async () => {
    const lease = await client().acquire(LOCK, { limit: 1 });
    const file = marker();
    const run = binary('run', LOCK, '--wait', '30s', '--', 'sh', '-c', `echo started > ${file}`);
    await until(async () => run.stderr().includes('waiting up to 30s'), 'the run to find the lock full');
    run.child.kill('SIGTERM');
    const result = await run.done;
    expect(result.code).toBe(143);
    expect(result.stderr.trim().split('\n')).toEqual([
      `cdk-sfn-semaphore: ${LOCK}: 1 of 1 permits in use, waiting up to 30s`,
      `cdk-sfn-semaphore: ${LOCK}: interrupted (SIGTERM) while waiting for a permit`,
    ]);
    expect(fs.existsSync(file)).toBe(false);
    expect(await client().release(LOCK, lease!.leaseId)).toBe(true);
  });
});

describe('lock names', () => {
  test('the client refuses a lock name it cannot key: empty, too long, or with the ticket key separator (U+001F)', async () => {
    await expect(client().acquire('')).rejects.toThrow('the lock name must be 1 to 255 characters long, got: ""');
    await expect(client().status('x'.repeat(256))).rejects.toThrow(/the lock name must be 1 to 255 characters long/);
    await expect(client().release('jobs\u001f1', 'lease-x')).rejects.toThrow('the lock name must not contain the character U+001F (it keys the queue\'s ticket items), got: "jobs\\u001f1"');
  });

  test('the client refuses what would grow the lock item past its bound: a limit above 1000, an owner above 100 bytes', async () => {
    await expect(client().acquire(LOCK, { limit: 1001 })).rejects.toThrow(
      'the limit must be an integer from 1 to 1000 (the holders share one item of at most 400 KB), got: 1001',
    );
    await expect(client().acquire(LOCK, { limit: 1, owner: 'o'.repeat(101) })).rejects.toThrow('the owner must be at most 100 bytes long (UTF-8), got 101');
    // Bytes, not characters: 34 three-byte characters are 102 bytes.
    await expect(client().acquire(LOCK, { limit: 1, owner: '\u20ac'.repeat(34) })).rejects.toThrow('the owner must be at most 100 bytes long (UTF-8), got 102');
    expect((await client().status(LOCK)).holders).toEqual([]);
  });

  test('the client refuses a rate interval a workflow could not have: not whole seconds, or above a day', async () => {
    for (const bad of [0, 1.5, 86_401, Number.NaN]) {
      await expect(client().acquire(LOCK, { limit: 1, rateIntervalSeconds: bad })).rejects.toThrow(
        `rateIntervalSeconds must be a whole number of seconds from 1 to 86400 (one day), got: ${bad}`,
      );
    }
    expect((await client().status(LOCK)).holders).toEqual([]);
  });
});

describe('the client\'s release', () => {
  test('two releases at once claim different tickets: each serves, hands off to and wakes its own waiter', async () => {
    const lock = 'two-releases';
    const arn = (name: string) => `arn:aws:states:us-east-1:123456789012:execution:Other:${name}`;
    const config = { endpoint: sim.db.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'local', secretAccessKey: 'local' } };
    const plain = new DynamoDBClient(config);
    const lease = { M: { [HOLDER_ACQUIRED_AT]: { S: new Date().toISOString() }, [HOLDER_LEASE_EXPIRES_AT]: { N: String(Date.now() + 600_000) } } };
    const ticket = (n: number, name: string) => ({
      lockName: { S: ticketKey(lock, n) },
      [TICKET_WAITER]: { S: arn(name) },
      [HOLDER_REDRIVE_COUNT]: { N: '0' },
      [HOLDER_LEASE_SECONDS]: { N: '0' },
      concurrencyLimit: { N: '2' },
      [TICKET_WAIT_TOKEN]: { S: `token-${name}` },
    });
    // Two leases hold both permits; executions c and d wait on tickets 1 and 2.
    await plain.send(
      new PutItemCommand({
        TableName: table,
        Item: {
          'lockName': { S: lock },
          'permitsInUse': { N: '2' },
          'concurrencyLimit': { N: '2' },
          'fencingToken': { N: '7' },
          'lease-a': lease,
          'lease-b': lease,
          'queueHead': { N: '0' },
          'queueTail': { N: '2' },
        },
      }),
    );
    await plain.send(new PutItemCommand({ TableName: table, Item: ticket(1, 'c') }));
    await plain.send(new PutItemCommand({ TableName: table, Item: ticket(2, 'd') }));
    const woken: Array<[string | undefined, unknown]> = [];
    const stepFunctions = {
      send: async (command: SendTaskSuccessCommand) => {
        woken.push([command.input.taskToken, JSON.parse(command.input.output ?? 'null')]);
        return {};
      },
    } as unknown as SFNClient;
    const a = new SemaphoreClient({ tableName: table, dynamodb: plain, stepFunctions });
    // b's writes are recorded, and a's whole release runs just after b claimed its ticket.
    const names = new Map([[RELEASE_UPDATE, 'release'], [PEEK_UPDATE, 'peek'], [SERVE_TICKET_UPDATE, 'serve'], [HAND_OFF_UPDATE, 'hand off']]);
    const writes: string[] = [];
    const bDynamo = new DynamoDBClient(config);
    bDynamo.middlewareStack.add(
      (next) => async (args) => {
        const input = args.input as { UpdateExpression?: string; ConditionExpression?: string };
        const write = input.UpdateExpression !== undefined ? names.get(input.UpdateExpression) ?? input.UpdateExpression : input.ConditionExpression === DELETE_SERVED_CONDITION ? 'delete' : undefined;
        if (write !== undefined) {
          writes.push(write);
          if (write === 'serve' && !writes.slice(0, -1).includes('serve')) expect(await a.release(lock, 'lease-a')).toBe(true);
        }
        return next(args);
      },
      { step: 'initialize' },
    );
    const b = new SemaphoreClient({ tableName: table, dynamodb: bDynamo, stepFunctions });
    try {
      expect(await b.release(lock, 'lease-b')).toBe(true);

      // Refused give-back (tickets wait), claim of ticket 1 (c), then its serve, hand-off and delete:
      // a claimed ticket 2 meanwhile, so neither release raced the other for a waiter.
      expect(writes).toEqual(['release', 'peek', 'serve', 'hand off', 'delete']);
      // Each waiter woken once, with the token its hand-off drew (in the order of the grants).
      expect(woken).toEqual([
        ['token-d', { fencingToken: 8 }],
        ['token-c', { fencingToken: 9 }],
      ]);
      const item = (await plain.send(new GetItemCommand({ TableName: table, Key: { lockName: { S: lock } }, ConsistentRead: true }))).Item!;
      expect(item.permitsInUse.N).toBe('2');
      expect([item.queueHead.N, item.queueTail.N]).toEqual(['2', '2']);
      expect(Object.keys(item).filter((k) => k.startsWith('lease-'))).toEqual([]);
      expect(item[arn('c')]?.M).toBeDefined();
      expect(item[arn('d')]?.M).toBeDefined();
      // Both served tickets' items are gone.
      for (const n of [1, 2]) {
        const gone = await plain.send(new GetItemCommand({ TableName: table, Key: { lockName: { S: ticketKey(lock, n) } }, ConsistentRead: true }));
        expect(gone.Item).toBeUndefined();
      }
    } finally {
      await plain.send(new DeleteItemCommand({ TableName: table, Key: { lockName: { S: lock } } }));
    }
  });
});

describe('a client that goes next (the collector)', () => {
  const protocol = () => ({ tableName: table, clockSkewMs: 0 });
  const flows = () => ({ dynamodb: plainClient(), stepFunctions: new SFNClient({ endpoint: sim.sfnApi!.endpoint, maxAttempts: 1 }) });
  const lease = () => ({
    M: { [HOLDER_ACQUIRED_AT]: { S: new Date().toISOString() }, [HOLDER_LEASE_EXPIRES_AT]: { N: String(Date.now() + 600_000) } },
  });
  const lockItem = async (lock: string) =>
    (await plainClient().send(new GetItemCommand({ TableName: table, Key: { lockName: { S: lock } }, ConsistentRead: true }))).Item!;
  const drop = (lock: string) => plainClient().send(new DeleteItemCommand({ TableName: table, Key: { lockName: { S: lock } } }));

  test('weighted: registers beside a queue, is short while the holders hold, completes with all its permits once they are back; a lost answer finds them', async () => {
    const lock = 'collector-flows';
    // Two leases hold both permits; a ticket waits (its execution asleep).
    await plainClient().send(
      new PutItemCommand({
        TableName: table,
        Item: { 'lockName': { S: lock }, 'permitsInUse': { N: '2' }, 'concurrencyLimit': { N: '2' }, 'fencingToken': { N: '5' }, 'queueHead': { N: '0' }, 'queueTail': { N: '1' }, 'lease-a': lease(), 'lease-b': lease() },
      }),
    );
    try {
      expect(shouldCollect(await lockItem(lock))).toBe(true);
      const request = { limit: 2, leaseSeconds: 60, permits: 2 };
      expect(await runFlow(registerCollector(protocol(), lock, 'lease-c', { ...request, owner: 'ci' }), flows())).toBe(true);
      // One collector at a time.
      expect(await runFlow(registerCollector(protocol(), lock, 'lease-d', request), flows())).toBe(false);
      expect(shouldCollect(await lockItem(lock))).toBe(false);
      const registered = await lockItem(lock);
      expect([registered.collecting, registered.collectGate, registered.permitsInUse]).toEqual([{ N: '1' }, { N: '0' }, { N: '2' }]);
      expect(registered['lease-c'].M).toMatchObject({ [HOLDER_PERMITS]: { N: '0' }, [HOLDER_COLLECTING]: { N: '1' }, [HOLDER_OWNER]: { S: 'ci' } });
      // An acquire of its own (a registration whose answer was lost) tells it that it collects.
      expect(await runFlow(acquireAttempt(protocol(), lock, 'lease-c', request), flows())).toMatchObject({ collecting: true });
      // A newcomer is refused beside the permit given back to the collector.
      expect(await client().release(lock, 'lease-a')).toBe(true);
      expect(await runFlow(acquireAttempt(protocol(), lock, 'lease-e', { limit: 2, leaseSeconds: 60 }), flows())).not.toHaveProperty('lease');
      expect(await runFlow(completeCollecting(protocol(), lock, 'lease-c', request), flows())).not.toHaveProperty('lease');
      expect(await client().release(lock, 'lease-b')).toBe(true);

      const done = await runFlow(completeCollecting(protocol(), lock, 'lease-c', request), flows());
      expect(done.lease).toMatchObject({ lockName: lock, leaseId: 'lease-c', permits: 2, fencingToken: 6, limit: 2, lockLimit: 2 });
      const completed = await lockItem(lock);
      expect(completed.permitsInUse).toEqual({ N: '2' });
      expect(completed.collecting).toBeUndefined();
      expect(completed.collectGate).toBeUndefined();
      expect(completed['lease-c'].M).toMatchObject({ [HOLDER_PERMITS]: { N: '2' }, [HOLDER_EXTRA_PERMITS]: { N: '1' }, [HOLDER_IN_BODY]: { N: '1' }, [HOLDER_OWNER]: { S: 'ci' } });
      expect(completed['lease-c'].M![HOLDER_COLLECTING]).toBeUndefined();
      // Its answer lost, it looks again: its entry holds them, with a fresh fencing token.
      expect((await runFlow(completeCollecting(protocol(), lock, 'lease-c', request), flows())).lease).toMatchObject({ permits: 2, fencingToken: 7 });
    } finally {
      await drop(lock);
    }
  });

  test('renews its registration once half has passed; a registration reclaimed meanwhile is gone, and it starts again', async () => {
    const lock = 'collector-renewal';
    await plainClient().send(
      new PutItemCommand({
        TableName: table,
        Item: { 'lockName': { S: lock }, 'permitsInUse': { N: '1' }, 'concurrencyLimit': { N: '1' }, 'queueHead': { N: '0' }, 'queueTail': { N: '1' }, 'lease-a': lease() },
      }),
    );
    try {
      // Registered 40 s ago: 20 s of its minute left.
      expect(await runFlow(atClock(-40_000, registerCollector(protocol(), lock, 'lease-c', { limit: 1 })), flows())).toBe(true);
      const request = { limit: 1, leaseSeconds: 60 };
      expect(await runFlow(completeCollecting(protocol(), lock, 'lease-c', request), flows())).not.toHaveProperty('lease');
      expect(Number((await lockItem(lock))['lease-c'].M![HOLDER_LEASE_EXPIRES_AT].N) - Date.now()).toBeGreaterThan(50_000);
      // Its place given up (or reclaimed): the next look says so.
      expect(await runFlow(abandonCollecting(protocol(), lock, 'lease-c'), flows())).toEqual({ removed: 0, admitted: 0 });
      expect(await runFlow(completeCollecting(protocol(), lock, 'lease-c', request), flows())).toMatchObject({ gone: true });
      expect((await lockItem(lock)).collecting).toEqual({ N: '0' });
    } finally {
      await drop(lock);
    }
  });

  test('never completes above a limit lowered since it registered', async () => {
    const lock = 'collector-lowered';
    await plainClient().send(
      new PutItemCommand({
        TableName: table,
        Item: { 'lockName': { S: lock }, 'permitsInUse': { N: '2' }, 'concurrencyLimit': { N: '3' }, 'queueHead': { N: '0' }, 'queueTail': { N: '1' }, 'lease-a': lease(), 'lease-b': lease() },
      }),
    );
    try {
      expect(await runFlow(registerCollector(protocol(), lock, 'lease-c', { limit: 3 }), flows())).toBe(true);
      // Its gate (3 less 1) lets it in beside the two held, but the lock's limit is 2 by now (as when a
      // workflow's acquire recorded it between the client's read and its registration, or before a
      // registration whose answer was lost): a third permit would be one too many.
      await plainClient().send(
        new UpdateItemCommand({ TableName: table, Key: { lockName: { S: lock } }, UpdateExpression: 'SET concurrencyLimit = :two', ExpressionAttributeValues: { ':two': { N: '2' } } }),
      );
      expect(await runFlow(completeCollecting(protocol(), lock, 'lease-c', { limit: 3, leaseSeconds: 60 }), flows())).not.toHaveProperty('lease');
      expect((await lockItem(lock)).permitsInUse).toEqual({ N: '2' });
    } finally {
      await drop(lock);
    }
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

  test('--clock-skew and $CDK_SFN_SEMAPHORE_CLOCK_SKEW set the margin', async () => {
    const stale = await client().acquire(LOCK, { leaseSeconds: 1, limit: 1 });
    await new Promise((r) => setTimeout(r, 1200));
    const expired = async (moreEnv: NodeJS.ProcessEnv, ...argv: string[]) => JSON.parse((await cliWith(moreEnv, ...argv)).stdout).holders[0].expired;
    expect(await expired({}, 'status', LOCK, '--json')).toBe(false);
    expect(await expired({ CDK_SFN_SEMAPHORE_CLOCK_SKEW: '0' }, 'status', LOCK, '--json')).toBe(true);
    // The option wins over the variable.
    expect(await expired({ CDK_SFN_SEMAPHORE_CLOCK_SKEW: '0' }, 'status', LOCK, '--json', '--clock-skew', '1m')).toBe(false);
    expect((await cli('acquire', LOCK, '--no-wait')).code).toBe(3);
    const reclaimed = await cli('acquire', LOCK, '--no-wait', '--clock-skew', '0s');
    expect(reclaimed.code).toBe(0);
    expect((await client().status(LOCK)).holders.map((h) => h.id)).toEqual([reclaimed.stdout]);
    expect(reclaimed.stdout).not.toBe(stale!.leaseId);
    expect((await cli('release', LOCK, reclaimed.stdout)).code).toBe(0);
  });

  test('the reconciler sweeps an expired CLI lease and leaves a live one alone', async () => {
    // The reconciler runs on the simulation's clock, 100 times faster than this test's: a lease of a
    // second has long expired (30 s margin included) for it, one of a day has not. A lock of scripts
    // alone: the workflow's lock has its limit of 1, which a client's limit cannot raise.
    const scripts = 'nightly-scripts';
    const stale = await client().acquire(scripts, { leaseSeconds: 1, limit: 2, owner: 'crashed-job' });
    const live = await client().acquire(scripts, { leaseSeconds: 86_400, limit: 2 });
    await sim.sleep(60);
    const result = (await sim.invokeFunction('WorkflowReconcilerFunction', {})) as { reclaimed: Array<{ holder: string; reason: string }> };
    expect(result.reclaimed).toEqual([{ lockName: scripts, holder: stale!.leaseId, reason: expect.stringMatching(/^lease expired at /) }]);
    expect((await client().status(scripts)).holders.map((h) => h.id)).toEqual([live!.leaseId]);
    expect(await client().release(scripts, live!.leaseId)).toBe(true);
    expect(await client().status(scripts)).toMatchObject({ permitsInUse: 0, limit: 2, holders: [] });
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

  test("an execution is listed by its holder id; force-release takes that id or the execution's ARN", async () => {
    const execution = await executionInside();
    const status = JSON.parse((await cli('status', LOCK, '--json')).stdout);
    expect(status.holders).toMatchObject([{ id: execution.holderId, kind: 'execution' }]);
    expect(execution.holderId).toMatch(/^[0-9a-f]{32}:/);
    const forced = await cli('force-release', LOCK, execution.arn, '--reason', 'stuck');
    expect([forced.code, forced.stderr]).toEqual([0, `cdk-sfn-semaphore: ${LOCK}: released ${execution.arn} by force: stuck`]);
    expect((await client().status(LOCK)).permitsInUse).toBe(0);
    expect((await cli('force-release', LOCK, execution.holderId, '--reason', 'again')).code).toBe(3);
    await finishExecution(execution);
  });

  test('the client releases and renews leases only: an execution\'s permit needs forceRelease', async () => {
    await expect(client().release(LOCK, EXECUTION_ARN)).rejects.toThrow(/is an execution, not a lease/);
    await expect(client().renew(LOCK, EXECUTION_ARN)).rejects.toThrow(/is an execution, not a lease/);
    expect(await client().forceRelease(LOCK, EXECUTION_ARN)).toBe(false);
  });
});

describe('usage and errors', () => {
  test.each(['acquire', 'renew', 'release', 'run', 'status', 'force-release'])('%s --help', async (command) => {
    const help = await cli(command, '--help');
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(new RegExp(`^Usage: cdk-sfn-semaphore ${command} LOCK`));
    expect(help.stdout).toContain('AWS_ENDPOINT_URL_DYNAMODB');
    expect(help.stdout).toContain('--clock-skew D');
  });

  test('run --help says where signals go', async () => {
    const help = (await cli('run', '--help')).stdout;
    expect(help).toContain('SIGINT, SIGTERM, SIGHUP and SIGQUIT');
    expect(help).toContain('SIGKILL cannot be passed on');
    expect(help).toContain('process group');
  });

  test('no arguments: the usage on stderr, exit 2', async () => {
    const result = await cli();
    expect(result.code).toBe(2);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/^Usage: cdk-sfn-semaphore COMMAND LOCK/);
  });

  test('the AWS SDK\'s warning about Node versions stays off stderr', async () => {
    const result = await binary('status', LOCK).done;
    expect([result.code, result.stderr]).toEqual([0, '']);
  });

  test.each<[string[], number, string | RegExp]>([
    [['lock'], 2, "cdk-sfn-semaphore: unknown command 'lock' (acquire, renew, release, run, status, force-release; see --help)"],
    [['acquire'], 2, 'cdk-sfn-semaphore: acquire: expected LOCK, got nothing (see cdk-sfn-semaphore acquire --help)'],
    [['acquire', LOCK, '--lease', 'soon'], 2, "cdk-sfn-semaphore: acquire: --lease must be a duration such as 90s, 15m or 2h (more than 0), got: 'soon'"],
    [['acquire', LOCK, '--lease', '500ms'], 2, "cdk-sfn-semaphore: acquire: --lease takes seconds, minutes, hours or days (90s, 15m, 2h, 1d), not milliseconds, got: '500ms'"],
    [['acquire', LOCK, '--wait', '100ms'], 2, "cdk-sfn-semaphore: acquire: --wait takes seconds, minutes, hours or days (90s, 15m, 2h, 1d), not milliseconds, got: '100ms'"],
    [['run', LOCK, '--lease', '9s', '--', 'true'], 2, "cdk-sfn-semaphore: run: --lease must be at least 10s (it is renewed every third of it), got: '9s'"],
    [['renew', LOCK, 'lease-x', '--lease', '5'], 2, "cdk-sfn-semaphore: renew: --lease must be at least 10s (it is renewed every third of it), got: '5'"],
    [['acquire', LOCK, '--limit', '1001'], 2, "cdk-sfn-semaphore: acquire: --limit must be an integer from 1 to 1000, got: '1001'"],
    [['acquire', LOCK, '--limit', '0'], 2, "cdk-sfn-semaphore: acquire: --limit must be an integer from 1 to 1000, got: '0'"],
    [['acquire', LOCK, '--limit', '0x10'], 2, "cdk-sfn-semaphore: acquire: --limit must be an integer from 1 to 1000, got: '0x10'"],
    [['acquire', LOCK, '--limit', '1e1'], 2, "cdk-sfn-semaphore: acquire: --limit must be an integer from 1 to 1000, got: '1e1'"],
    [['acquire', LOCK, '--rate-interval', '1.5s'], 2, "cdk-sfn-semaphore: acquire: --rate-interval must be a whole number of seconds from 1s to 1d (as a workflow's rateLimit), got: '1.5s'"],
    [['run', LOCK, '--rate-interval', '2d', '--', 'true'], 2, "cdk-sfn-semaphore: run: --rate-interval must be a whole number of seconds from 1s to 1d (as a workflow's rateLimit), got: '2d'"],
    [['acquire', LOCK, '--rate-interval', '0'], 2, "cdk-sfn-semaphore: acquire: --rate-interval must be a duration such as 90s, 15m or 2h (more than 0), got: '0'"],
    [['acquire', LOCK, '--wait', '5s', '--no-wait'], 2, 'cdk-sfn-semaphore: acquire: --wait and --no-wait exclude each other'],
    [['acquire', LOCK, '--colour'], 2, /^cdk-sfn-semaphore: acquire: Unknown option '--colour'/],
    [['status', LOCK, '--clock-skew', 'a bit'], 2, "cdk-sfn-semaphore: status: --clock-skew must be a duration such as 90s, 15m or 2h, got: 'a bit'"],
    [['run', LOCK], 2, "cdk-sfn-semaphore: run: no command after '--' (see cdk-sfn-semaphore run --help)"],
    [
      ['release', LOCK, EXECUTION_ARN],
      2,
      `cdk-sfn-semaphore: release: ${EXECUTION_ARN} is an execution, not a lease: free its permit with 'cdk-sfn-semaphore force-release LOCK HOLDER --reason TEXT' (stop it first)`,
    ],
    [['renew', LOCK, EXECUTION_ARN], 2, `cdk-sfn-semaphore: renew: ${EXECUTION_ARN} is an execution, not a lease: its permit lasts as long as it runs`],
    [['release', LOCK, 'lease-nobody'], 3, `cdk-sfn-semaphore: ${LOCK}: lease-nobody holds no permit`],
    [['status', LOCK, '--table', 'no-such-table'], 1, /^cdk-sfn-semaphore: ResourceNotFoundException: /],
  ])('%j exits %i', async (argv, code, message) => {
    const result = await cli(...argv);
    expect(result.code).toBe(code);
    if (typeof message === 'string') expect(result.stderr).toBe(message);
    else expect(result.stderr).toMatch(message);
    expect(result.stderr.split('\n')).toHaveLength(1);
  });

  test('a bad $CDK_SFN_SEMAPHORE_CLOCK_SKEW is a usage error naming the variable', async () => {
    const result = await cliWith({ CDK_SFN_SEMAPHORE_CLOCK_SKEW: '5ms' }, 'status', LOCK);
    expect([result.code, result.stderr]).toEqual([
      2,
      "cdk-sfn-semaphore: status: $CDK_SFN_SEMAPHORE_CLOCK_SKEW takes seconds, minutes, hours or days (90s, 15m, 2h, 1d), not milliseconds, got: '5ms'",
    ]);
  });

  test('no table: a usage error naming the flag and the variable', async () => {
    const out: string[] = [];
    const code = await main(['status', LOCK], { stdout: () => undefined, stderr: (l) => out.push(l), env: {} });
    expect([code, out]).toEqual([2, ['cdk-sfn-semaphore: status: no table: pass --table NAME or set CDK_SFN_SEMAPHORE_TABLE']]);
  });

  test('the owner is user@host; $USER, $LOGNAME or the uid where the system has no entry for the user', async () => {
    const host = os.hostname();
    expect(defaultOwner({})).toBe(`${os.userInfo().username}@${host}`);
    // The os module itself (the CLI reads its functions when called), not this file's namespace object.
    const userInfo = jest.spyOn(jest.requireActual<typeof os>('os'), 'userInfo').mockImplementation(() => {
      throw new Error('ENOENT: no such file or directory, uv_os_get_passwd');
    });
    try {
      expect(defaultOwner({ USER: 'ci', LOGNAME: 'other' })).toBe(`ci@${host}`);
      expect(defaultOwner({ LOGNAME: 'builder' })).toBe(`builder@${host}`);
      expect(defaultOwner({})).toBe(`uid-${process.getuid!()}@${host}`);
      // Cut to the client's 100 bytes when the name is longer.
      expect(defaultOwner({ USER: 'u'.repeat(150) })).toBe('u'.repeat(100));
      const acquired = await cliWith({ USER: 'container-job' }, 'acquire', LOCK, '--no-wait');
      expect(acquired.code).toBe(0);
      expect((await client().status(LOCK)).holders[0].owner).toBe(`container-job@${host}`);
      expect((await cli('release', LOCK, acquired.stdout)).code).toBe(0);
    } finally {
      userInfo.mockRestore();
    }
  });

  test('durations', () => {
    expect([parseDuration('90'), parseDuration('90s'), parseDuration('15m'), parseDuration('2h'), parseDuration('1d')]).toEqual([90, 90, 900, 7200, 86400]);
    expect(parseDuration('1 hour')).toBeUndefined();
    expect(parseDuration('500ms')).toBeUndefined();
  });
});

let stateMachine: ReturnType<typeof workflowStack>['workflow']['stateMachine'] | undefined;
function workflowStateMachine() {
  // The simulator was started from this same app: find the workflow's state machine by its logical ID.
  stateMachine ??= workflowStack({ concurrencyLimit: 1 }).workflow.stateMachine;
  return stateMachine;
}
