import { Duration } from 'aws-cdk-lib';
import { awsSampleSubject } from '../bench/run';
import { demoSubject } from '../demo/run';
import { brokenInvariants, runScenario } from '../simulator';
import { checkExpressionCache, installExpressionCache } from '../simulator/expression-cache';
import { RateLimit, WaitStrategy } from '../src';

/*
 * The simulator parses each shape of DynamoDB expression once (simulator/expression-cache.ts). With the
 * check on, every request the cache serves is parsed by dynalite as well, and each difference recorded:
 * these tests run requests and whole scenarios that way, and require no difference, and the requests
 * the cache must leave to dynalite (equal names, names written in the expression, BETWEEN) to get
 * dynalite's own answers.
 */

// dynalite has no type declarations.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { validateExpressions } = require('dynalite/validations') as { validateExpressions(data: Request): string | undefined };

interface Request {
  UpdateExpression?: string;
  ConditionExpression?: string;
  ProjectionExpression?: string;
  ExpressionAttributeNames?: Record<string, string>;
  ExpressionAttributeValues?: Record<string, unknown>;
  _updates?: { sections: Array<{ path: unknown[]; val: unknown }> };
  _condition?: unknown;
}

/** dynalite's check of a request's expressions: its error, or the request with its parses. */
function validate(request: Request): { error?: string; request: Request } {
  const copy = { ...request };
  return { error: validateExpressions(copy), request: copy };
}

const ONE = { ':v': { N: '1' } };
const BETWEEN = '#a BETWEEN :low AND :high';
const served = () => checkExpressionCache(true).served;

beforeAll(() => {
  installExpressionCache();
  checkExpressionCache(true);
});
afterAll(() => checkExpressionCache(false));
afterEach(() => expect(checkExpressionCache(true).mismatches).toEqual([]));

test('a second request of the same shape gets its own names and values, not the first one\'s', () => {
  const request = (holder: string, at: string): Request => ({
    UpdateExpression: 'SET #permits = if_not_exists(#permits, :zero) + :one, #holder = :entry',
    ConditionExpression: 'attribute_not_exists(#holder) AND (attribute_not_exists(#permits) OR #permits < :limit)',
    ExpressionAttributeNames: { '#permits': 'permitsInUse', '#holder': holder },
    ExpressionAttributeValues: { ':zero': { N: '0' }, ':one': { N: '1' }, ':limit': { N: '5' }, ':entry': { M: { a: { S: at } } } },
  });
  const before = served();
  const first = validate(request('holder-1', '2026-01-01T00:00:00Z'));
  const second = validate(request('holder-2', '2026-01-01T00:00:09Z'));

  expect(first.error).toBeUndefined();
  expect(second.error).toBeUndefined();
  expect(served() - before).toBe(4);
  expect(JSON.stringify(second.request._updates)).toContain('"holder-2"');
  expect(JSON.stringify(second.request._updates)).not.toContain('holder-1');
  expect(JSON.stringify(second.request._updates)).toContain('00:00:09');
  expect(JSON.stringify(second.request._updates)).not.toContain('00:00:00');
  expect(JSON.stringify(second.request._condition)).toContain('"holder-2"');
});

test('a name written in an expression that does not use its placeholder is still served from the cache', () => {
  // The AWS sample's acquire: its update sets #count, its condition writes the same attribute plainly.
  const request: Request = {
    UpdateExpression: 'SET #count = #count + :one, #owner = :at',
    ConditionExpression: 'currentlockcount <> :limit and attribute_not_exists(#owner)',
    ExpressionAttributeNames: { '#count': 'currentlockcount', '#owner': 'execution-1' },
    ExpressionAttributeValues: { ':one': { N: '1' }, ':limit': { N: '5' }, ':at': { S: 'now' } },
  };
  const before = served();
  expect(validate(request).error).toBeUndefined();
  expect(validate({ ...request, ExpressionAttributeNames: { '#count': 'currentlockcount', '#owner': 'execution-2' } }).error).toBeUndefined();
  expect(served() - before).toBe(4);
});

test.each([
  [
    'two placeholders of one name (after a request of the same expression with two names)',
    { UpdateExpression: 'SET #a = :v, #b = :v', ExpressionAttributeNames: { '#a': 'x', '#b': 'y' }, ExpressionAttributeValues: ONE },
    { UpdateExpression: 'SET #a = :v, #b = :v', ExpressionAttributeNames: { '#a': 'x', '#b': 'x' }, ExpressionAttributeValues: ONE },
    /^Invalid UpdateExpression: Two document paths overlap with each other/,
  ],
  [
    'a placeholder for a name the expression also writes',
    { UpdateExpression: 'SET permitsInUse = :v, #p = :v', ExpressionAttributeNames: { '#p': 'other' }, ExpressionAttributeValues: ONE },
    { UpdateExpression: 'SET permitsInUse = :v, #p = :v', ExpressionAttributeNames: { '#p': 'permitsInUse' }, ExpressionAttributeValues: ONE },
    /^Invalid UpdateExpression: Two document paths overlap with each other/,
  ],
  [
    'a placeholder of a projection for a name another placeholder has',
    { ProjectionExpression: '#a, #b', ExpressionAttributeNames: { '#a': 'x', '#b': 'y' } },
    { ProjectionExpression: '#a, #b', ExpressionAttributeNames: { '#a': 'x', '#b': 'x' } },
    /^Invalid ProjectionExpression: Two document paths overlap with each other/,
  ],
  [
    'an operand of another type',
    { UpdateExpression: 'SET #a = #a + :v', ExpressionAttributeNames: { '#a': 'count' }, ExpressionAttributeValues: { ':v': { N: '1' } } },
    { UpdateExpression: 'SET #a = #a + :v', ExpressionAttributeNames: { '#a': 'count' }, ExpressionAttributeValues: { ':v': { S: '1' } } },
    /^Invalid UpdateExpression: Incorrect operand type for operator or function/,
  ],
  [
    'BETWEEN, whose check reads the values',
    { ConditionExpression: BETWEEN, ExpressionAttributeNames: { '#a': 'n' }, ExpressionAttributeValues: { ':low': { N: '1' }, ':high': { N: '2' } } },
    { ConditionExpression: BETWEEN, ExpressionAttributeNames: { '#a': 'n' }, ExpressionAttributeValues: { ':low': { N: '3' }, ':high': { N: '2' } } },
    /^Invalid ConditionExpression: The BETWEEN operator requires upper bound to be greater than or equal to lower bound/,
  ],
  [
    'a name given and not used',
    { ConditionExpression: 'attribute_exists(#a)', ExpressionAttributeNames: { '#a': 'n' } },
    { ConditionExpression: 'attribute_exists(#a)', ExpressionAttributeNames: { '#a': 'n', '#b': 'm' } },
    /^Value provided in ExpressionAttributeNames unused in expressions: keys: \{#b\}$/,
  ],
  [
    'a value used and not given',
    { ConditionExpression: '#a = :v', ExpressionAttributeNames: { '#a': 'n' }, ExpressionAttributeValues: { ':v': { N: '1' } } },
    { ConditionExpression: '#a = :v', ExpressionAttributeNames: { '#a': 'n' }, ExpressionAttributeValues: { ':w': { N: '1' } } },
    /^Invalid ConditionExpression: An expression attribute value used in expression is not defined; attribute value: :v$/,
  ],
])('%s: refused as dynalite refuses it, and the valid request beside it passes', (_name, valid: Request, invalid: Request, message: RegExp) => {
  expect(validate(valid).error).toBeUndefined();
  expect(validate(invalid).error).toMatch(message);
  // Again, now that both shapes were seen.
  expect(validate(valid).error).toBeUndefined();
  expect(validate(invalid).error).toMatch(message);
});

const RATE = { count: 4, intervalSeconds: 10 };

test.each([
  ['the queue', {}, undefined],
  ['polling', { waitStrategy: WaitStrategy.POLLING }, undefined],
  // Body slots: 4 permits a 10 s for the rate, 2 bodies at once.
  ['a rate above the limit', { rateLimit: RateLimit.of(4, Duration.seconds(10)), pollInterval: Duration.seconds(2) }, RATE],
])('whole scenarios with faults, %s: every request the cache served parsed as dynalite parses it', async (_name, props, rate) => {
  const before = served();
  const result = await runScenario(demoSubject(2, { queueCheckInterval: Duration.seconds(60), ...props }), {
    rate,
    executions: 12,
    limit: 2,
    workSeconds: 5,
    timeScale: 0.02,
    failureRate: 0.1,
    abortInsideRate: 0.2,
    lostEventRate: 0.3,
    lostWakeUpRate: 0.2,
    dynamoFaults: { throttleRate: 0.05, serverErrorAfterWriteRate: 0.05 },
    capacity: { partitionLimits: true },
    seed: 5,
    extendHorizon: true,
    horizonFactor: 8,
  });
  expect(brokenInvariants(result, 2)).toEqual([]);
  // The cache served most of the run's expressions (each write has one or two).
  expect(served() - before).toBeGreaterThan(result.dynamoCallsPerExecution * result.executions * 0.5);
});

test("the AWS sample's run: every request the cache served parsed as dynalite parses it", async () => {
  const before = served();
  const options = { executions: 12, limit: 2, workSeconds: 5, timeScale: 0.02, capacity: { partitionLimits: true }, seed: 5 };
  const result = await runScenario(awsSampleSubject(2), options);
  expect(result.maxInside).toBe(2);
  expect(served() - before).toBeGreaterThan(result.dynamoCallsPerExecution * result.executions * 0.5);
});
