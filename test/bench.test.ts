import { fellBehind, Scenario } from '../bench/run';
import { ScenarioResult } from '../simulator';

const scenario = (options: Partial<Scenario['options']>): Scenario => ({
  name: 'burst',
  description: 'a burst',
  options: { executions: 2000, limit: 10, workSeconds: 1, ...options },
});
const result = (lastArrivalSeconds: number) => ({ subject: 'cdk-sfn-semaphore (queue)', lastArrivalSeconds }) as ScenarioResult;

test('the bench flags a scenario whose executions arrived after the first bodies could have ended', () => {
  // Arrived within a body's time: at once, as far as the lock can tell.
  expect(fellBehind(scenario({}), result(0.9))).toBeUndefined();
  // After it: the simulator fell behind the clock.
  const warning = fellBehind(scenario({}), result(3.4));
  expect(warning).toContain('burst (cdk-sfn-semaphore (queue))');
  expect(warning).toContain('answered 3.4 s');
  expect(warning).toContain('(1.0 s)');
  // Injected latency lands calls late on purpose: it is allowed on top; the default body is 15 s.
  expect(fellBehind(scenario({ workSeconds: undefined, dynamoFaults: { maxLatencySeconds: 10 } }), result(24))).toBeUndefined();
  expect(fellBehind(scenario({ workSeconds: undefined, dynamoFaults: { maxLatencySeconds: 10 } }), result(26))).toContain('(25.0 s)');
  // One execution has nothing to arrive with.
  expect(fellBehind(scenario({ executions: 1 }), result(30))).toBeUndefined();
});
