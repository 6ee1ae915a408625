import { Duration } from 'aws-cdk-lib';
import { demoSubject } from '../demo/run';
import { brokenInvariants, runScenario } from '../simulator';
import { RateLimit } from '../src';

/*
 * The rate's drain on the wall clock, in a file of its own: `jest.retryTimes` is per file (jest-circus
 * reads it when the file's tests run, wherever it was called), and the other tests of the rate must not
 * be retried.
 */

// The drain is measured on the wall clock, beside the other test file Jest runs at the same time: a
// clean-clone CI run of 2026-11-28 drained in 1.21x while the other worker ran a heavy file (the bench,
// alone, 1.11x). Up to two more tries; the bound itself stays.
jest.retryTimes(2, { logErrorsBeforeRetry: true });

test('200 executions at 5 per second with 1 s bodies, under DynamoDB\'s capacity rules: never 6 in any second, drained within 1.2x of 40 s', async () => {
  const rate = { count: 5, intervalSeconds: 1 };
  // In real time (a time scale of 1), the hand-offs' CPU barely shows in a drain of 40 s, even on a
  // busy machine (at 0.5 a machine with one free core for two test files drained in 1.54x; at the
  // tests' usual 0.02 it would add seconds per hand-off).
  const result = await runScenario(demoSubject(5, { rateLimit: RateLimit.of(5, Duration.seconds(1)) }), {
    executions: 200,
    limit: 5,
    workSeconds: 1,
    workJitter: 0,
    timeScale: 1,
    rate,
    capacity: { partitionLimits: true },
    sweepAfterRun: false,
  });

  expect(brokenInvariants(result, 5)).toEqual([]);
  expect(result.succeeded).toBe(200);
  expect(result.mostAdmissionsInInterval).toBe(5);
  expect(result.drainRatio).toBeLessThanOrEqual(1.2);
});
