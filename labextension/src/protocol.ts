/**
 * The sidebar <-> kernel comm protocol (the Python side is jupyter_dist/ui/sidebar/protocol.py).
 *
 * Every message from the kernel is checked here before the sidebar uses it; anything that
 * does not match is dropped with a console warning. The frameworks are not listed here: the
 * kernel's `welcome` names those its registry offers (a framework a package adds through the
 * `jupyter_dist.frameworks` entry point group among them), with their titles since 1.1.
 * Since 1.2 the sidebar may ask for every rank's stack (`stacks`); the kernel answers with the
 * text `%dist stacks` prints, from its subshell while a cell runs.
 */

export const PROTOCOL_VERSION = '1.2';
export const TARGET_NAME = 'jupyter_dist';

export const BACKENDS = ['auto', 'nccl', 'gloo', 'mpi'] as const;
export const LAUNCHERS = ['mpi', 'local', 'ssh', 'slurm'] as const;
export const IB_MODES = ['auto', 'on', 'off'] as const;
export const CLUSTER_ACTIONS = ['start', 'stop', 'restart'] as const;
export const CLUSTER_STATES = ['stopped', 'starting', 'idle', 'busy', 'error'] as const;
export const RANK_STATES = ['idle', 'busy', 'dead', 'starting'] as const;

export type Backend = (typeof BACKENDS)[number];
export type Launcher = (typeof LAUNCHERS)[number];
export type IbMode = (typeof IB_MODES)[number];
export type ClusterAction = (typeof CLUSTER_ACTIONS)[number];
export type ClusterState = (typeof CLUSTER_STATES)[number];
export type RankState = (typeof RANK_STATES)[number];

/** The kernel's RunDefaults.to_json(). */
export interface RunDefaults {
  framework: string; // a name the welcome's `frameworks` lists
  nodes: number;
  procs_per_node: number | null;
  backend: Backend;
  launcher: Launcher | null;
  hosts: string[];
  ib: IbMode;
  timeout: number | null;
}

export interface RankStatus {
  rank: number;
  node: number;
  local_rank: number;
  host: string;
  state: RankState;
}

export interface ClusterStatus {
  state: ClusterState;
  engines: number;
  expected: number;
  ranks: RankStatus[];
  framework?: string | null;
  nodes?: number;
  procs_per_node?: number;
  message?: string;
}

// frontend -> kernel
export interface HelloMsg {
  type: 'hello';
  version: string;
}
export interface GetStateMsg {
  type: 'get_state';
}
export interface SetDefaultsMsg {
  type: 'set_defaults';
  defaults: Partial<RunDefaults>;
}
export interface ClusterMsg {
  type: 'cluster';
  action: ClusterAction;
}
export interface StacksMsg {
  type: 'stacks';
}
export type Request = HelloMsg | GetStateMsg | SetDefaultsMsg | ClusterMsg | StacksMsg;

// kernel -> frontend
export interface WelcomeMsg {
  type: 'welcome';
  version: string;
  frameworks: string[]; // the kernel's registry, in its order
  framework_titles?: Record<string, string>; // name -> title (from 1.1)
  backends: string[];
  launchers: string[];
  ib_modes: string[];
  actions: string[];
  factory_defaults?: RunDefaults;
}
export interface StateMsg {
  type: 'state';
  defaults: RunDefaults;
  status: ClusterStatus;
}
export type ErrorCode = 'bad_message' | 'version_mismatch' | 'no_hello' | 'action_failed';
export interface ErrorMsg {
  type: 'error';
  code?: ErrorCode;
  message: string;
}
/** Every rank's stack and collective, as `%dist stacks` prints them (from 1.2). */
export interface StacksReplyMsg {
  type: 'stacks';
  text: string;
}
export type Reply = WelcomeMsg | StateMsg | StacksReplyMsg | ErrorMsg;

export const STOPPED_STATUS: ClusterStatus = {
  state: 'stopped',
  engines: 0,
  expected: 0,
  ranks: []
};

export function majorOf(version: string): string {
  return version.split('.', 1)[0];
}

export function sameMajor(version: string): boolean {
  return majorOf(version) === majorOf(PROTOCOL_VERSION);
}

// ------------------------------------------------------------------ validation

type Obj = { [key: string]: unknown };

function isObj(value: unknown): value is Obj {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isOneOf<T extends string>(choices: readonly T[], value: unknown): value is T {
  return typeof value === 'string' && (choices as readonly string[]).includes(value);
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value) && value >= 0;
}

function isStrings(value: unknown): value is string[] {
  return Array.isArray(value) && value.every(item => typeof item === 'string');
}

function isName(value: unknown): value is string {
  return typeof value === 'string' && value.length > 0;
}

function isTitles(value: unknown): value is Record<string, string> {
  return isObj(value) && Object.values(value).every(item => typeof item === 'string');
}

const HOST_NAME =
  /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;
const IPV4 =
  /^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/;
const IPV6 = /^(?=.*:)[0-9A-Fa-f:.]{2,45}$/;

/** A host name, an IPv4 or an IPv6 address (the kernel checks IPv6 strictly). */
export function isHost(value: string): boolean {
  if (IPV4.test(value) || IPV6.test(value)) {
    return true;
  }
  return HOST_NAME.test(value) && !/^[\d.]+$/.test(value);
}

/** Split a comma/space separated host list; returns the bad entries too. */
export function parseHosts(text: string): { hosts: string[]; bad: string[] } {
  const items = text
    .split(/[\s,]+/)
    .map(item => item.trim())
    .filter(item => item.length > 0);
  return { hosts: items.filter(isHost), bad: items.filter(item => !isHost(item)) };
}

export function isRunDefaults(value: unknown): value is RunDefaults {
  return (
    isObj(value) &&
    isName(value.framework) &&
    isCount(value.nodes) &&
    (value.procs_per_node === null || isCount(value.procs_per_node)) &&
    isOneOf(BACKENDS, value.backend) &&
    (value.launcher === null || isOneOf(LAUNCHERS, value.launcher)) &&
    isStrings(value.hosts) &&
    isOneOf(IB_MODES, value.ib) &&
    (value.timeout === null || (typeof value.timeout === 'number' && value.timeout > 0))
  );
}

function isRankStatus(value: unknown): value is RankStatus {
  return (
    isObj(value) &&
    isCount(value.rank) &&
    isCount(value.node) &&
    isCount(value.local_rank) &&
    typeof value.host === 'string' &&
    isOneOf(RANK_STATES, value.state)
  );
}

export function isClusterStatus(value: unknown): value is ClusterStatus {
  return (
    isObj(value) &&
    isOneOf(CLUSTER_STATES, value.state) &&
    isCount(value.engines) &&
    isCount(value.expected) &&
    Array.isArray(value.ranks) &&
    value.ranks.every(isRankStatus) &&
    (value.framework === undefined ||
      value.framework === null ||
      typeof value.framework === 'string') &&
    (value.nodes === undefined || isCount(value.nodes)) &&
    (value.procs_per_node === undefined || isCount(value.procs_per_node)) &&
    (value.message === undefined || typeof value.message === 'string')
  );
}

/** Check one kernel message; returns null (and the reason) when it is not in the protocol. */
export function parseReply(data: unknown): { reply: Reply | null; reason?: string } {
  if (!isObj(data)) {
    return { reply: null, reason: 'not an object' };
  }
  switch (data.type) {
    case 'welcome':
      if (
        typeof data.version === 'string' &&
        isStrings(data.frameworks) &&
        data.frameworks.every(isName) &&
        (data.framework_titles === undefined || isTitles(data.framework_titles)) &&
        isStrings(data.backends) &&
        isStrings(data.launchers) &&
        isStrings(data.ib_modes) &&
        isStrings(data.actions) &&
        (data.factory_defaults === undefined || isRunDefaults(data.factory_defaults))
      ) {
        return { reply: data as unknown as WelcomeMsg };
      }
      return { reply: null, reason: 'malformed welcome' };
    case 'state':
      if (isRunDefaults(data.defaults) && isClusterStatus(data.status)) {
        return { reply: data as unknown as StateMsg };
      }
      return { reply: null, reason: 'malformed state' };
    case 'stacks':
      if (typeof data.text === 'string') {
        return { reply: data as unknown as StacksReplyMsg };
      }
      return { reply: null, reason: 'malformed stacks' };
    case 'error':
      if (typeof data.message === 'string') {
        return { reply: data as unknown as ErrorMsg };
      }
      return { reply: null, reason: 'malformed error' };
    default:
      return { reply: null, reason: `unknown message type ${String(data.type)}` };
  }
}

export function hello(): HelloMsg {
  return { type: 'hello', version: PROTOCOL_VERSION };
}

/** One entry of the framework select: the name `-f` takes, the title shown. */
export interface FrameworkChoice {
  name: string;
  title: string;
}

/** What the controls offer: the kernel's choices, as its welcome sent them. */
export interface Choices {
  frameworks: FrameworkChoice[];
  backends: string[];
  launchers: string[];
  ib_modes: string[];
}

/** Before any welcome: no frameworks (the kernel's registry decides), the protocol's other lists. */
export const NO_KERNEL_CHOICES: Choices = {
  frameworks: [],
  backends: [...BACKENDS],
  launchers: [...LAUNCHERS],
  ib_modes: [...IB_MODES]
};

/** The choices a welcome offers; a 1.0 kernel sends no titles, so a framework is titled by its name. */
export function choicesOf(msg: WelcomeMsg): Choices {
  const titles = msg.framework_titles ?? {};
  const titleOf = (name: string): string =>
    (Object.prototype.hasOwnProperty.call(titles, name) && titles[name]) || name;
  return {
    frameworks: msg.frameworks.map(name => ({ name, title: titleOf(name) })),
    backends: [...msg.backends],
    launchers: [...msg.launchers],
    ib_modes: [...msg.ib_modes]
  };
}
