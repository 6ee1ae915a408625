/*
 * DynamoDB as the protocol checker sees it: a table in memory, and the condition and update
 * expressions of `UpdateItem` evaluated as one atomic step, with DynamoDB's semantics. Written
 * independently of dynalite, so that the conformance test (test/protocol-conformance.test.ts), which
 * replays the model's steps against dynalite, compares two implementations rather than one with itself.
 *
 * What it covers is what the lock protocol uses: comparisons (=, <>, <, <=, >, >=), AND / OR / NOT,
 * BETWEEN, IN, attribute_exists, attribute_not_exists, attribute_type, begins_with, contains, size;
 * SET (with +, -, if_not_exists, list_append), REMOVE; nested map fields and list indexes; the
 * validation errors a request gets before its condition is read (unused or undefined names and values,
 * overlapping paths) and after (an operand of the wrong type, a document path that does not exist).
 * Anything else (ADD, DELETE, sets, binary) is refused loudly rather than approximated.
 */

/** A DynamoDB attribute value, in the JSON of the DynamoDB API. */
export type AttributeValue =
  | { S: string }
  | { N: string }
  | { BOOL: boolean }
  | { NULL: true }
  | { M: Record<string, AttributeValue> }
  | { L: AttributeValue[] };

export type Item = Record<string, AttributeValue>;

/**
 * An error as the DynamoDB API names it (`ConditionalCheckFailedException`, `ValidationException`).
 * Not an Error: the checker raises millions of them, and an Error's stack trace costs more than the
 * rest of a step.
 */
export class DynamoDbError {
  constructor(
    public readonly name: string,
    public readonly message: string,
  ) {}
}

function validation(message: string): DynamoDbError {
  return new DynamoDbError('ValidationException', message);
}

// ---- tokens ----

type Token =
  | { t: 'name'; v: string } // #name
  | { t: 'value'; v: string } // :value
  | { t: 'ident'; v: string } // attribute name or keyword
  | { t: 'int'; v: number }
  | { t: 'op'; v: string };

const tokenCache = new Map<string, Token[]>();

/** The tokens of an expression (cached: a model step evaluates the same few expressions again and again). */
function tokenize(text: string): Token[] {
  let tokens = tokenCache.get(text);
  if (!tokens) {
    tokens = scan(text);
    tokenCache.set(text, tokens);
  }
  return tokens;
}

function scan(text: string): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (/\s/.test(c)) {
      i++;
    } else if (c === '#' || c === ':') {
      const m = /^[#:][0-9a-zA-Z_]+/.exec(text.slice(i));
      if (!m) throw validation(`Invalid expression: syntax error at '${text.slice(i, i + 10)}'`);
      tokens.push({ t: c === '#' ? 'name' : 'value', v: m[0] });
      i += m[0].length;
    } else if (/[0-9]/.test(c)) {
      const m = /^[0-9]+/.exec(text.slice(i))!;
      tokens.push({ t: 'int', v: Number(m[0]) });
      i += m[0].length;
    } else if (/[a-zA-Z_]/.test(c)) {
      const m = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(text.slice(i))!;
      tokens.push({ t: 'ident', v: m[0] });
      i += m[0].length;
    } else {
      const two = text.slice(i, i + 2);
      if (['<>', '<=', '>='].includes(two)) {
        tokens.push({ t: 'op', v: two });
        i += 2;
      } else if ('()[].,=<>+-'.includes(c)) {
        tokens.push({ t: 'op', v: c });
        i++;
      } else {
        throw validation(`Invalid expression: unexpected character '${c}'`);
      }
    }
  }
  return tokens;
}

// ---- parsing ----

type PathSegment = string | number;
type Path = PathSegment[];

type Operand = { t: 'path'; path: Path } | { t: 'value'; name: string } | { t: 'size'; path: Path };

type Condition =
  | { t: 'and' | 'or'; a: Condition; b: Condition }
  | { t: 'not'; a: Condition }
  | { t: 'cmp'; op: string; l: Operand; r: Operand }
  | { t: 'between'; v: Operand; lo: Operand; hi: Operand }
  | { t: 'in'; v: Operand; list: Operand[] }
  | { t: 'fn'; name: string; path: Path; arg?: Operand };

type ValueExpr =
  | Operand
  | { t: 'if_not_exists'; path: Path; fallback: ValueExpr }
  | { t: 'list_append'; a: ValueExpr; b: ValueExpr }
  | { t: '+' | '-'; a: ValueExpr; b: ValueExpr };

type Action = { t: 'SET'; path: Path; value: ValueExpr } | { t: 'REMOVE'; path: Path };

const KEYWORDS = new Set(['AND', 'OR', 'NOT', 'BETWEEN', 'IN', 'SET', 'REMOVE', 'ADD', 'DELETE']);

/** Names and values of one request, and which of them the expressions used. */
class Scope {
  public readonly usedNames = new Set<string>();
  public readonly usedValues = new Set<string>();
  constructor(
    public readonly names: Record<string, string>,
    public readonly values: Record<string, AttributeValue>,
  ) {}

  public name(token: string): string {
    const name = this.names[token];
    if (name === undefined) throw validation(`An expression attribute name used in the document path is not defined; attribute name: ${token}`);
    this.usedNames.add(token);
    return name;
  }

  public value(token: string): string {
    if (this.values[token] === undefined) throw validation(`An expression attribute value used in expression is not defined; attribute value: ${token}`);
    this.usedValues.add(token);
    return token;
  }
}

class Parser {
  private i = 0;
  constructor(
    private readonly tokens: Token[],
    private readonly scope: Scope,
  ) {}

  public done(): boolean {
    return this.i >= this.tokens.length;
  }

  private peek(): Token | undefined {
    return this.tokens[this.i];
  }

  private next(): Token {
    const token = this.tokens[this.i++];
    if (!token) throw validation('Invalid expression: unexpected end of input');
    return token;
  }

  private isOp(v: string): boolean {
    const t = this.peek();
    return t?.t === 'op' && t.v === v;
  }

  private isKeyword(v: string): boolean {
    const t = this.peek();
    return t?.t === 'ident' && t.v.toUpperCase() === v;
  }

  private expectOp(v: string): void {
    const t = this.next();
    if (t.t !== 'op' || t.v !== v) throw validation(`Invalid expression: expected '${v}'`);
  }

  public path(): Path {
    const first = this.next();
    const path: Path = [this.segmentName(first)];
    for (;;) {
      if (this.isOp('.')) {
        this.next();
        path.push(this.segmentName(this.next()));
      } else if (this.isOp('[')) {
        this.next();
        const index = this.next();
        if (index.t !== 'int') throw validation('Invalid expression: a list index must be a number');
        this.expectOp(']');
        path.push(index.v);
      } else {
        return path;
      }
    }
  }

  private segmentName(token: Token): string {
    if (token.t === 'name') return this.scope.name(token.v);
    if (token.t === 'ident' && !KEYWORDS.has(token.v.toUpperCase())) return token.v;
    throw validation('Invalid expression: expected an attribute name');
  }

  // condition := or
  public condition(): Condition {
    let left = this.conjunction();
    while (this.isKeyword('OR')) {
      this.next();
      left = { t: 'or', a: left, b: this.conjunction() };
    }
    return left;
  }

  private conjunction(): Condition {
    let left = this.negation();
    while (this.isKeyword('AND')) {
      this.next();
      left = { t: 'and', a: left, b: this.negation() };
    }
    return left;
  }

  private negation(): Condition {
    if (this.isKeyword('NOT')) {
      this.next();
      return { t: 'not', a: this.negation() };
    }
    return this.primary();
  }

  private primary(): Condition {
    if (this.isOp('(')) {
      this.next();
      const inner = this.condition();
      this.expectOp(')');
      return inner;
    }
    const t = this.peek();
    if (t?.t === 'ident' && this.tokens[this.i + 1]?.t === 'op' && (this.tokens[this.i + 1] as { v: string }).v === '(' && t.v !== 'size') {
      this.next();
      this.expectOp('(');
      const path = this.path();
      let arg: Operand | undefined;
      if (this.isOp(',')) {
        this.next();
        arg = this.operand();
      }
      this.expectOp(')');
      if (!['attribute_exists', 'attribute_not_exists', 'attribute_type', 'begins_with', 'contains'].includes(t.v)) {
        throw validation(`Invalid ConditionExpression: the function is not supported here: ${t.v}`);
      }
      return { t: 'fn', name: t.v, path, arg };
    }
    const left = this.operand();
    if (this.isKeyword('BETWEEN')) {
      this.next();
      const lo = this.operand();
      if (!this.isKeyword('AND')) throw validation('Invalid expression: BETWEEN needs AND');
      this.next();
      return { t: 'between', v: left, lo, hi: this.operand() };
    }
    if (this.isKeyword('IN')) {
      this.next();
      this.expectOp('(');
      const list = [this.operand()];
      while (this.isOp(',')) {
        this.next();
        list.push(this.operand());
      }
      this.expectOp(')');
      return { t: 'in', v: left, list };
    }
    const op = this.next();
    if (op.t !== 'op' || !['=', '<>', '<', '<=', '>', '>='].includes(op.v)) throw validation('Invalid expression: expected a comparator');
    return { t: 'cmp', op: op.v, l: left, r: this.operand() };
  }

  private operand(): Operand {
    const t = this.peek();
    if (t?.t === 'value') {
      this.next();
      return { t: 'value', name: this.scope.value(t.v) };
    }
    if (t?.t === 'ident' && t.v === 'size' && this.tokens[this.i + 1]?.t === 'op') {
      this.next();
      this.expectOp('(');
      const path = this.path();
      this.expectOp(')');
      return { t: 'size', path };
    }
    return { t: 'path', path: this.path() };
  }

  // update := (SET a = v, ... | REMOVE p, ...)+
  public update(): Action[] {
    const actions: Action[] = [];
    const seen = new Set<string>();
    while (!this.done()) {
      const clause = this.next();
      const keyword = clause.t === 'ident' ? clause.v.toUpperCase() : '';
      if (keyword === 'ADD' || keyword === 'DELETE') throw new Error(`the checker's DynamoDB model has no ${keyword} action`);
      if (keyword !== 'SET' && keyword !== 'REMOVE') throw validation('Invalid UpdateExpression: expected SET or REMOVE');
      if (seen.has(keyword)) throw validation(`Invalid UpdateExpression: The "${keyword}" section can only be used once in an update expression`);
      seen.add(keyword);
      for (;;) {
        const path = this.path();
        if (keyword === 'SET') {
          this.expectOp('=');
          actions.push({ t: 'SET', path, value: this.setValue() });
        } else {
          actions.push({ t: 'REMOVE', path });
        }
        if (!this.isOp(',')) break;
        this.next();
      }
    }
    return actions;
  }

  private setValue(): ValueExpr {
    const left = this.setOperand();
    if (this.isOp('+') || this.isOp('-')) {
      const op = this.next() as { v: '+' | '-' };
      return { t: op.v, a: left, b: this.setOperand() };
    }
    return left;
  }

  private setOperand(): ValueExpr {
    const t = this.peek();
    if (t?.t === 'ident' && (t.v === 'if_not_exists' || t.v === 'list_append') && this.tokens[this.i + 1]?.t === 'op') {
      this.next();
      this.expectOp('(');
      if (t.v === 'if_not_exists') {
        const path = this.path();
        this.expectOp(',');
        const fallback = this.setValue();
        this.expectOp(')');
        return { t: 'if_not_exists', path, fallback };
      }
      const a = this.setValue();
      this.expectOp(',');
      const b = this.setValue();
      this.expectOp(')');
      return { t: 'list_append', a, b };
    }
    if (t?.t === 'value') {
      this.next();
      return { t: 'value', name: this.scope.value(t.v) };
    }
    return { t: 'path', path: this.path() };
  }
}

// ---- evaluation ----

function typeOf(v: AttributeValue | undefined): string | undefined {
  return v === undefined ? undefined : Object.keys(v)[0];
}

/** The value at a path of an item, or undefined. */
export function valueAt(item: Item, path: Path): AttributeValue | undefined {
  let current: AttributeValue | undefined = { M: item };
  for (const segment of path) {
    if (current === undefined) return undefined;
    const node: any = current;
    current = typeof segment === 'number' ? node.L?.[segment] : node.M?.[segment];
  }
  return current;
}

function operandValue(operand: Operand, item: Item, scope: Scope): AttributeValue | undefined {
  if (operand.t === 'value') return scope.values[operand.name];
  const v = valueAt(item, operand.path);
  if (operand.t === 'path') return v;
  if (v === undefined) return undefined;
  if ('S' in v) return { N: String(Buffer.byteLength(v.S, 'utf8')) };
  if ('L' in v) return { N: String(v.L.length) };
  if ('M' in v) return { N: String(Object.keys(v.M).length) };
  return undefined;
}

function compareValues(a: AttributeValue, b: AttributeValue): number | undefined {
  if ('N' in a && 'N' in b) {
    const d = Number(a.N) - Number(b.N);
    return d < 0 ? -1 : d > 0 ? 1 : 0;
  }
  if ('S' in a && 'S' in b) {
    // DynamoDB orders strings by their UTF-8 bytes.
    return Buffer.compare(Buffer.from(a.S, 'utf8'), Buffer.from(b.S, 'utf8'));
  }
  return undefined;
}

function equalValues(a: AttributeValue | undefined, b: AttributeValue | undefined): boolean {
  return a !== undefined && b !== undefined && stableStringify(a) === stableStringify(b);
}

function holds(condition: Condition, item: Item, scope: Scope): boolean {
  switch (condition.t) {
    case 'and':
      return holds(condition.a, item, scope) && holds(condition.b, item, scope);
    case 'or':
      return holds(condition.a, item, scope) || holds(condition.b, item, scope);
    case 'not':
      return !holds(condition.a, item, scope);
    case 'fn': {
      const v = valueAt(item, condition.path);
      const arg = condition.arg && operandValue(condition.arg, item, scope);
      switch (condition.name) {
        case 'attribute_exists':
          return v !== undefined;
        case 'attribute_not_exists':
          return v === undefined;
        case 'attribute_type':
          return v !== undefined && arg !== undefined && 'S' in arg && typeOf(v) === arg.S;
        case 'begins_with':
          return v !== undefined && arg !== undefined && 'S' in v && 'S' in arg && v.S.startsWith(arg.S);
        default: // contains
          if (v === undefined || arg === undefined) return false;
          if ('S' in v && 'S' in arg) return v.S.includes(arg.S);
          if ('L' in v) return v.L.some((e) => equalValues(e, arg));
          return false;
      }
    }
    case 'cmp': {
      const l = operandValue(condition.l, item, scope);
      const r = operandValue(condition.r, item, scope);
      if (condition.op === '=') return equalValues(l, r);
      if (condition.op === '<>') return !equalValues(l, r);
      if (l === undefined || r === undefined) return false;
      const c = compareValues(l, r);
      if (c === undefined) return false;
      return { '<': c < 0, '<=': c <= 0, '>': c > 0, '>=': c >= 0 }[condition.op]!;
    }
    case 'between': {
      const v = operandValue(condition.v, item, scope);
      const lo = operandValue(condition.lo, item, scope);
      const hi = operandValue(condition.hi, item, scope);
      if (v === undefined || lo === undefined || hi === undefined) return false;
      const a = compareValues(v, lo);
      const b = compareValues(v, hi);
      return a !== undefined && b !== undefined && a >= 0 && b <= 0;
    }
    case 'in': {
      const v = operandValue(condition.v, item, scope);
      return condition.list.some((o) => equalValues(v, operandValue(o, item, scope)));
    }
  }
}

function resolveValue(value: ValueExpr, item: Item, scope: Scope): AttributeValue {
  switch (value.t) {
    case 'value':
      return scope.values[value.name];
    case 'path': {
      const v = valueAt(item, value.path);
      if (v === undefined) throw validation('The provided expression refers to an attribute that does not exist in the item');
      return v;
    }
    case 'size':
      throw validation('Invalid UpdateExpression: size is not allowed in an update expression');
    case 'if_not_exists':
      return valueAt(item, value.path) ?? resolveValue(value.fallback, item, scope);
    case 'list_append': {
      const a = resolveValue(value.a, item, scope);
      const b = resolveValue(value.b, item, scope);
      if (!('L' in a) || !('L' in b)) throw validation('An operand in the update expression has an incorrect data type');
      return { L: [...a.L, ...b.L] };
    }
    case '+':
    case '-': {
      const a = resolveValue(value.a, item, scope);
      const b = resolveValue(value.b, item, scope);
      if (!('N' in a) || !('N' in b)) throw validation('An operand in the update expression has an incorrect data type');
      const n = value.t === '+' ? Number(a.N) + Number(b.N) : Number(a.N) - Number(b.N);
      if (!Number.isSafeInteger(n)) throw new Error(`the checker's DynamoDB model computes integers only, got ${n}`);
      return { N: String(n) };
    }
  }
}

function overlaps(a: Path, b: Path): boolean {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** What `UpdateItem` takes (the fields the protocol uses). */
export interface UpdateItemInput {
  readonly TableName: string;
  readonly Key: Item;
  readonly UpdateExpression: string;
  readonly ConditionExpression?: string;
  readonly ExpressionAttributeNames?: Record<string, string>;
  readonly ExpressionAttributeValues?: Record<string, AttributeValue>;
  readonly ReturnValues?: 'NONE' | 'ALL_OLD' | 'UPDATED_OLD' | 'ALL_NEW' | 'UPDATED_NEW';
}

export interface DeleteItemInput {
  readonly TableName: string;
  readonly Key: Item;
  readonly ConditionExpression?: string;
  readonly ExpressionAttributeNames?: Record<string, string>;
  readonly ExpressionAttributeValues?: Record<string, AttributeValue>;
  readonly ReturnValues?: 'NONE' | 'ALL_OLD';
}

export interface UpdateItemOutput {
  readonly Attributes?: Item;
}

/** DynamoDB's largest item, in bytes. */
export const MAX_ITEM_BYTES = 400 * 1024;

/**
 * Tables in memory. Items are plain JSON, so a table's contents can be part of a model state,
 * copied, compared and hashed.
 */
/**
 * Request validation both writes share: the condition parsed (undefined without one), then every
 * expression attribute name and value used somewhere, as DynamoDB requires.
 */
function parseConditionAndCheckUsage(conditionExpression: string | undefined, scope: Scope): Condition | undefined {
  let condition: Condition | undefined;
  if (conditionExpression !== undefined) {
    const parser = new Parser(tokenize(conditionExpression), scope);
    condition = parser.condition();
    if (!parser.done()) throw validation('Invalid ConditionExpression: Syntax error');
  }
  const unusedNames = Object.keys(scope.names).filter((n) => !scope.usedNames.has(n));
  if (unusedNames.length) throw validation(`Value provided in ExpressionAttributeNames unused in expressions: keys: {${unusedNames.join(', ')}}`);
  const unusedValues = Object.keys(scope.values).filter((v) => !scope.usedValues.has(v));
  if (unusedValues.length) throw validation(`Value provided in ExpressionAttributeValues unused in expressions: keys: {${unusedValues.join(', ')}}`);
  return condition;
}

export class ModelDynamoDb {
  /** Items by table name, then by their key (the JSON of the key attributes, in key schema order). */
  constructor(
    public readonly tables: Record<string, Record<string, Item>>,
    private readonly keySchemas: Record<string, string[]>,
  ) {}

  private table(name: string): Record<string, Item> {
    const table = this.tables[name];
    if (!table) throw new DynamoDbError('ResourceNotFoundException', `Requested resource not found: Table: ${name} not found`);
    return table;
  }

  private keyOf(tableName: string, key: Item): string {
    const schema = this.keySchemas[tableName];
    if (Object.keys(key).length !== schema.length || schema.some((k) => key[k] === undefined)) {
      throw validation('The provided key element does not match the schema');
    }
    return stableStringify(schema.map((k) => key[k]));
  }

  public getItem(input: { TableName: string; Key: Item }): { Item?: Item } {
    const item = this.table(input.TableName)[this.keyOf(input.TableName, input.Key)];
    return item ? { Item: clone(item) } : {};
  }

  public scan(input: { TableName: string }): { Items: Item[] } {
    return { Items: Object.values(this.table(input.TableName)).map(clone) };
  }

  /** `DeleteItem`: the condition on the item as it is, then the delete, as one atomic step. */
  public deleteItem(input: DeleteItemInput): UpdateItemOutput {
    const table = this.table(input.TableName);
    const key = this.keyOf(input.TableName, input.Key);
    const scope = new Scope(input.ExpressionAttributeNames ?? {}, input.ExpressionAttributeValues ?? {});
    const condition = parseConditionAndCheckUsage(input.ConditionExpression, scope);
    const old = table[key];
    if (condition && !holds(condition, old ?? {}, scope)) {
      throw new DynamoDbError('ConditionalCheckFailedException', 'The conditional request failed');
    }
    delete table[key];
    return input.ReturnValues === 'ALL_OLD' && old ? { Attributes: clone(old) } : {};
  }

  /** `UpdateItem`: the condition on the item as it is, then every action, as one atomic step. */
  public updateItem(input: UpdateItemInput): UpdateItemOutput {
    const table = this.table(input.TableName);
    const key = this.keyOf(input.TableName, input.Key);
    const scope = new Scope(input.ExpressionAttributeNames ?? {}, input.ExpressionAttributeValues ?? {});

    // Request validation, before the item is read.
    const updateParser = new Parser(tokenize(input.UpdateExpression), scope);
    const actions = updateParser.update();
    const condition = parseConditionAndCheckUsage(input.ConditionExpression, scope);
    for (let i = 0; i < actions.length; i++) {
      for (let j = i + 1; j < actions.length; j++) {
        if (overlaps(actions[i].path, actions[j].path)) {
          throw validation('Invalid UpdateExpression: Two document paths overlap with each other; must remove or rewrite one of these paths');
        }
      }
    }
    const keySchema = this.keySchemas[input.TableName];
    if (actions.some((a) => keySchema.includes(a.path[0] as string))) {
      throw validation('One or more parameter values were invalid: Cannot update attribute lockName. This attribute is part of the key');
    }

    const old = table[key];
    const before: Item = old ?? {};
    if (condition && !holds(condition, before, scope)) {
      throw new DynamoDbError('ConditionalCheckFailedException', 'The conditional request failed');
    }
    // Every value is worked out from the item as it was, then the actions apply in order.
    const values = actions.map((a) => (a.t === 'SET' ? resolveValue(a.value, before, scope) : undefined));
    const after: Item = old ? clone(old) : clone(input.Key);
    actions.forEach((action, i) => {
      const parent = valueAt(after, action.path.slice(0, -1));
      const last = action.path[action.path.length - 1];
      const container = parent === undefined ? undefined : typeof last === 'number' ? ('L' in parent ? parent.L : undefined) : 'M' in parent ? parent.M : undefined;
      if (container === undefined) throw validation('The document path provided in the update expression is invalid for update');
      if (action.t === 'REMOVE') {
        if (Array.isArray(container)) {
          if ((last as number) < container.length) container.splice(last as number, 1);
        } else {
          delete (container as Record<string, AttributeValue>)[last as string];
        }
      } else if (Array.isArray(container)) {
        // SET of an index past the end appends, as DynamoDB does.
        if ((last as number) < container.length) container[last as number] = values[i]!;
        else container.push(values[i]!);
      } else {
        (container as Record<string, AttributeValue>)[last as string] = values[i]!;
      }
    });
    if (itemBytes(after) > MAX_ITEM_BYTES) throw validation('Item size to update has exceeded the maximum allowed size');
    table[key] = after;

    const paths = actions.map((a) => a.path);
    switch (input.ReturnValues ?? 'NONE') {
      case 'ALL_OLD':
        return old ? { Attributes: clone(old) } : {};
      case 'ALL_NEW':
        return { Attributes: clone(after) };
      case 'UPDATED_OLD':
        return old ? nonEmpty(project(old, paths)) : {};
      case 'UPDATED_NEW':
        return nonEmpty(project(after, paths));
      default:
        return {};
    }
  }
}

function nonEmpty(attributes: Item): UpdateItemOutput {
  return Object.keys(attributes).length ? { Attributes: attributes } : {};
}

/** The parts of an item at these paths, nested as in the item (what UPDATED_OLD and UPDATED_NEW return). */
function project(item: Item, paths: Path[]): Item {
  const result: Item = {};
  for (const path of paths) {
    const v = valueAt(item, path);
    if (v === undefined) continue;
    let target: AttributeValue = { M: result };
    for (let i = 0; i < path.length; i++) {
      const segment = path[i];
      const leaf = i === path.length - 1;
      if (typeof segment === 'number') {
        const list = (target as { L?: AttributeValue[] }).L ?? ((target as { L?: AttributeValue[] }).L = []);
        if (leaf) {list.push(clone(v));} else {
          const next = {} as AttributeValue;
          list.push(next);
          target = next;
        }
      } else {
        const node = target as { M?: Record<string, AttributeValue> };
        const map: Record<string, AttributeValue> = node.M ?? (node.M = {});
        if (leaf) map[segment] = clone(v);
        else target = map[segment] ?? (map[segment] = {} as AttributeValue);
      }
    }
  }
  return result;
}

/** DynamoDB's item size: attribute names plus values (numbers about 1 byte per 2 digits). */
export function itemBytes(item: Item): number {
  let total = 0;
  for (const [name, value] of Object.entries(item)) total += Buffer.byteLength(name, 'utf8') + valueBytes(value);
  return total;
}

function valueBytes(value: AttributeValue): number {
  if ('S' in value) return Buffer.byteLength(value.S, 'utf8');
  if ('N' in value) return 1 + Math.ceil(value.N.replace(/^-|\.|^0+/g, '').length / 2);
  if ('BOOL' in value || 'NULL' in value) return 1;
  if ('L' in value) return 3 + value.L.reduce((sum, v) => sum + 1 + valueBytes(v), 0);
  return 3 + itemBytes(value.M) + Object.keys(value.M).length;
}

/** A deep copy of plain JSON data (faster than a JSON round trip; undefined fields are dropped as JSON would). */
export function clone<T>(value: T): T {
  if (value === null || typeof value !== 'object') return value;
  if (Array.isArray(value)) {
    const out = new Array(value.length);
    for (let i = 0; i < value.length; i++) out[i] = clone(value[i]);
    return out as unknown as T;
  }
  const out: Record<string, unknown> = {};
  for (const k in value as Record<string, unknown>) {
    const v = (value as Record<string, unknown>)[k];
    if (v !== undefined) out[k] = clone(v);
  }
  return out as T;
}

/**
 * JSON with object keys in sorted order: equal values give equal text. With `rename`, every string
 * (keys included, before they are sorted) is renamed first.
 */
export function stableStringify(value: unknown, rename?: (s: string) => string): string {
  if (typeof value === 'string') return JSON.stringify(rename ? rename(value) : value);
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'undefined';
  if (Array.isArray(value)) return `[${value.map((v) => stableStringify(v, rename)).join(',')}]`;
  const entries = Object.keys(value as Record<string, unknown>)
    .filter((k) => (value as Record<string, unknown>)[k] !== undefined)
    .map((k) => [rename ? rename(k) : k, (value as Record<string, unknown>)[k]] as const)
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${stableStringify(v, rename)}`).join(',')}}`;
}
