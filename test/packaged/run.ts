import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

/*
 * Proof from an installed package, as a user's CI would run it: pack the library (built by the test
 * command before this runs), install the tarball into a fresh CDK app (test/packaged/app: TypeScript,
 * Jest, ts-jest type-checking every file, the package's declarations included), and run there the
 * README's "Test your workflow locally" example as its test. The example is read from the README, so
 * what the README shows is what compiles and passes.
 *
 * Usage: ts-node --transpile-only --project tsconfig.dev.json test/packaged/run.ts [--keep]
 */
const repo = path.resolve(__dirname, '..', '..');
const keep = process.argv.includes('--keep');

function run(command: string, args: string[], cwd: string): string {
  console.log(`$ ${command} ${args.join(' ')}   (in ${cwd})`);
  return execFileSync(command, args, { cwd, stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf-8', env: { ...process.env, CI: 'true' } });
}

/** The TypeScript block under the README heading `heading`. */
export function readmeExample(readme: string, heading: string): string {
  const start = readme.indexOf(`\n${heading}\n`);
  if (start < 0) throw new Error(`README.md has no heading "${heading}"`);
  const block = /```(?:ts|TypeScript)[^\n]*\n([\s\S]*?)```/.exec(readme.slice(start));
  if (!block) throw new Error(`README.md has no TypeScript block under "${heading}"`);
  return block[1];
}

/**
 * The kit from plain Node: three executions at limit 1 succeed one after another, and the lock is free.
 * Then the package's CLI, as its bin installed it (node_modules/.bin), takes the permit; an execution
 * queues behind it, and the CLI's release wakes it.
 */
const PLAIN_NODE = `
const { execFile } = require('child_process');
const path = require('path');
const { promisify } = require('util');
const { App, Duration, Stack } = require('aws-cdk-lib');
const sfn = require('aws-cdk-lib/aws-stepfunctions');
const { ConcurrencyControlledWorkflow } = require('cdk-sfn-semaphore');
const { WorkflowSimulator } = require('cdk-sfn-semaphore/testing');

async function main() {
  const stack = new Stack(new App(), 'Plain');
  const workflow = new ConcurrencyControlledWorkflow(stack, 'Workflow', { lockName: 'plain', body: new sfn.Wait(stack, 'Work', { time: sfn.WaitTime.duration(Duration.seconds(30)) }) });
  // (No scheduled sweep: the CLI's lease runs on real time, the simulation on a faster clock.)
  const sim = await WorkflowSimulator.start(workflow, { schedules: false });
  try {
    const executions = [1, 2, 3].map((id) => sim.start({ id }));
    await Promise.all(executions.map((e) => e.done));
    const statuses = executions.map((e) => e.status).join();
    let [lock] = await sim.locks('plain');
    if (statuses !== 'SUCCEEDED,SUCCEEDED,SUCCEEDED' || lock.permitsInUse !== 0) throw new Error('plain Node: ' + statuses + ', permits in use ' + lock.permitsInUse);
    console.log('plain Node: 3 executions at limit 1 succeeded, ' + sim.figures(executions).transitions.toFixed(1) + ' transitions each, lock free');

    // Asynchronously: the CLI's calls are served by this process.
    const cli = async (...args) =>
      (await promisify(execFile)(path.join(__dirname, 'node_modules', '.bin', 'cdk-sfn-semaphore'), [...args, '--table', sim.tableName])).stdout.trim();
    const leaseId = await cli('acquire', 'plain', '--no-wait');
    const waiting = sim.start({ id: 4 });
    await sim.simulator.sleep(60);
    [lock] = await sim.locks('plain');
    if (!leaseId || lock.holders.join() !== leaseId || lock.waiters.join() !== waiting.arn) throw new Error('the CLI: holders ' + lock.holders + ', waiters ' + lock.waiters);
    await cli('release', 'plain', leaseId);
    await waiting.done;
    [lock] = await sim.locks('plain');
    if (waiting.status !== 'SUCCEEDED' || lock.permitsInUse !== 0) throw new Error('the CLI: ' + waiting.status + ', permits in use ' + lock.permitsInUse);
    console.log('the CLI (bin): held the permit, an execution queued behind it, its release woke it');
  } finally {
    await sim.stop();
  }
}
// A hang (a wake-up that never comes) fails the run, as Jest's test timeout does, rather than holding CI.
setTimeout(() => { console.error('plain Node: not done within 5 minutes'); process.exit(1); }, 300000).unref();
main().catch((e) => { console.error(e); process.exit(1); });
`;

function main(): void {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'cdk-sfn-semaphore-packaged-'));
  try {
    const tarball = run('npm', ['pack', '--silent', '--pack-destination', work], repo).trim().split('\n').pop()!;
    const app = path.join(work, 'app');
    fs.cpSync(path.join(__dirname, 'app'), app, { recursive: true });
    fs.mkdirSync(path.join(app, 'test'));
    const example = readmeExample(fs.readFileSync(path.join(repo, 'README.md'), 'utf-8'), '## Test your workflow locally');
    fs.writeFileSync(path.join(app, 'test', 'workflow.test.ts'), example);
    run('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', path.join(work, tarball)], app);
    // The kit's dependencies came with the package, not with the app.
    const installed = JSON.parse(fs.readFileSync(path.join(app, 'package.json'), 'utf-8'));
    if (Object.keys(installed.dependencies ?? {}).join() !== 'cdk-sfn-semaphore') {
      throw new Error(`the app should depend on cdk-sfn-semaphore only, got: ${JSON.stringify(installed.dependencies)}`);
    }
    process.stdout.write(run('npx', ['jest', '--ci', '--colors=false'], app));
    // And in plain Node, without Jest or TypeScript.
    fs.writeFileSync(path.join(app, 'plain.js'), PLAIN_NODE);
    process.stdout.write(run('node', ['plain.js'], app));
  } finally {
    if (keep) console.log(`kept ${work}`);
    else fs.rmSync(work, { recursive: true, force: true });
  }
}

if (require.main === module) {
  main();
}
