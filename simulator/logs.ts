import type { Execution } from './simulator';

/*
 * What a state machine that logs at level ALL writes to CloudWatch Logs, and the metric filters that
 * count its lines. Step Functions writes one JSON line per history event
 * (https://docs.aws.amazon.com/step-functions/latest/dg/cw-logs.html):
 *
 *   {"id":"7","type":"ParallelStateEntered","details":{"input":"{}","inputDetails":{"truncated":false},"name":"Wait For Permit"},
 *    "previous_event_id":"6","event_timestamp":"1700000000000","execution_arn":"arn:aws:states:..."}
 *
 * The details are the history event's own (stateEnteredEventDetails, executionFailedEventDetails, ...):
 * a state's name on its entered and exited events, the error and cause on an execution's failure.
 */

/** One line of an execution's log, parsed. */
export interface ExecutionLogEvent {
  readonly id: string;
  readonly type: string;
  readonly details: Record<string, unknown>;
  readonly previous_event_id: string;
  readonly event_timestamp: string;
  readonly execution_arn: string;
}

/** The lines a state machine logging at level ALL writes for `execution`, all its runs together. */
export function logEventsOf(execution: Execution): ExecutionLogEvent[] {
  return execution.history.map((h, i) => {
    const details: Record<string, unknown> = {};
    if (h.name !== undefined) {
      Object.assign(details, { input: JSON.stringify(h.input ?? null), inputDetails: { truncated: false }, name: h.name });
    } else if (h.type.endsWith('StateExited') && h.state !== undefined) {
      Object.assign(details, { name: h.state, output: JSON.stringify(h.output ?? null), outputDetails: { truncated: false } });
    }
    if (h.error !== undefined) details.error = h.error;
    if (h.cause !== undefined) details.cause = h.cause;
    return {
      id: String(i + 1),
      type: h.type,
      details,
      previous_event_id: String(i),
      event_timestamp: String(h.timestamp),
      execution_arn: execution.arn,
    };
  });
}

/** A condition of a JSON filter pattern: `$.a.b = "text"` (or `!=`). */
interface Condition {
  readonly path: string[];
  readonly negated: boolean;
  readonly value: string;
}

const CONDITION = /^\(?\s*\$((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*(=|!=)\s*"((?:[^"\\]|\\.)*)"\s*\)?$/;

/**
 * Whether a CloudWatch Logs JSON filter pattern matches a log event
 * (https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/FilterAndPatternSyntax.html). Only the
 * patterns this library writes are modelled: conditions `$.field.field = "text"` or `!= "text"`,
 * exact strings without wildcards, joined by `&&`. Any other pattern is refused with an error, so that
 * a test never passes on a pattern the simulator does not understand.
 */
export function matchesFilterPattern(pattern: string, event: unknown): boolean {
  const body = /^\{\s*(.*?)\s*\}$/s.exec(pattern.trim());
  if (!body) throw new Error(`filter pattern not modelled by the simulator (only JSON patterns { ... }): ${pattern}`);
  const conditions: Condition[] = body[1].split('&&').map((part) => {
    const m = CONDITION.exec(part.trim());
    if (!m || /[*]/.test(m[3])) throw new Error(`filter pattern condition not modelled by the simulator (only $.field = "text", != and &&): ${part.trim()}`);
    return { path: m[1].slice(1).split('.'), negated: m[2] === '!=', value: JSON.parse(`"${m[3]}"`) };
  });
  return conditions.every((c) => {
    let value: unknown = event;
    for (const key of c.path) value = value !== null && typeof value === 'object' ? (value as Record<string, unknown>)[key] : undefined;
    // A string comparison matches only a field that is there with that text; != matches any other.
    const equal = typeof value === 'string' && value === c.value;
    return c.negated ? !equal : equal;
  });
}

/**
 * The log group (its logical ID in `template`) a state machine of the template logs every event to
 * (level ALL), or undefined when it does not log. A level that logs only some events (ERROR, FATAL), or
 * a log group the template does not define, is refused: the simulator does not model which lines they
 * keep, or where they go.
 */
function logGroupOf(template: { Resources?: Record<string, any> }, stateMachineId: string): string | undefined {
  const config = template.Resources?.[stateMachineId]?.Properties?.LoggingConfiguration;
  if (!config || config.Level === undefined || config.Level === 'OFF') return undefined;
  if (config.Level !== 'ALL') {
    throw new Error(`${stateMachineId} logs at level ${config.Level}: the simulator models the log lines of level ALL only (every history event)`);
  }
  const arn = config.Destinations?.[0]?.CloudWatchLogsLogGroup?.LogGroupArn;
  const getAtt = arn?.['Fn::GetAtt'];
  if (!Array.isArray(getAtt) || getAtt[1] !== 'Arn') {
    throw new Error(`${stateMachineId} logs to a log group the template does not define (${JSON.stringify(arn)}): the simulator cannot tell which metric filters see its lines`);
  }
  return getAtt[0];
}

/**
 * What each metric filter of a template (AWS::Logs::MetricFilter with a fixed MetricValue) counts over
 * the log lines of `executions`: metric name to sum. A filter sees the lines of the executions whose
 * state machine logs to its log group at level ALL; metrics of several filters with the same name add
 * up (give each workflow its own stack, or sum per filter with `matchesFilterPattern`, to tell them apart).
 */
export function metricFilterSums(template: { Resources?: Record<string, any> }, executions: Iterable<Execution>): Record<string, number> {
  const filters = Object.values(template.Resources ?? {}).filter((r) => r.Type === 'AWS::Logs::MetricFilter');
  const byGroup = new Map<string, ExecutionLogEvent[]>();
  for (const e of executions) {
    const group = logGroupOf(template, e.stateMachine.logicalId);
    if (group !== undefined) byGroup.set(group, [...(byGroup.get(group) ?? []), ...logEventsOf(e)]);
  }
  const sums: Record<string, number> = {};
  for (const filter of filters) {
    const group = filter.Properties.LogGroupName?.Ref;
    if (typeof group !== 'string') {
      throw new Error(`a metric filter on a log group the template does not define (${JSON.stringify(filter.Properties.LogGroupName)}) is not modelled by the simulator`);
    }
    const lines = byGroup.get(group) ?? [];
    for (const t of filter.Properties.MetricTransformations) {
      const value = Number(t.MetricValue);
      if (!Number.isFinite(value)) throw new Error(`metric value not modelled by the simulator (only a number): ${JSON.stringify(t.MetricValue)}`);
      const matched = lines.filter((line) => matchesFilterPattern(filter.Properties.FilterPattern, line)).length;
      sums[t.MetricName] = (sums[t.MetricName] ?? 0) + matched * value;
    }
  }
  return sums;
}
