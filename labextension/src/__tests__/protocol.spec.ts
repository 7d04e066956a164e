import {
  PROTOCOL_VERSION,
  hello,
  isHost,
  parseHosts,
  parseReply,
  sameMajor
} from '../protocol';
import { FACTORY_DEFAULTS } from '../model';

const welcome = {
  type: 'welcome',
  version: '1.0',
  frameworks: ['pytorch', 'mpi'],
  backends: ['auto', 'nccl', 'gloo', 'mpi'],
  launchers: ['mpi', 'local', 'ssh', 'slurm'],
  ib_modes: ['auto', 'on', 'off'],
  actions: ['start', 'stop', 'restart'],
  factory_defaults: FACTORY_DEFAULTS
};

const state = {
  type: 'state',
  defaults: { ...FACTORY_DEFAULTS, nodes: 2, procs_per_node: 2, hosts: ['a', 'b'] },
  status: {
    state: 'busy',
    engines: 4,
    expected: 4,
    framework: 'pytorch',
    nodes: 2,
    procs_per_node: 2,
    ranks: [{ rank: 0, node: 0, local_rank: 0, host: 'a', state: 'busy' }]
  }
};

describe('hello and versions', () => {
  it('says hello with the protocol version', () => {
    expect(hello()).toEqual({ type: 'hello', version: PROTOCOL_VERSION });
  });
  it('compares major versions only', () => {
    expect(sameMajor('1.0')).toBe(true);
    expect(sameMajor('1.9')).toBe(true);
    expect(sameMajor('2.0')).toBe(false);
    expect(sameMajor('0.1')).toBe(false);
  });
});

describe('parseReply', () => {
  it('accepts the three kernel messages', () => {
    expect(parseReply(welcome).reply?.type).toBe('welcome');
    expect(parseReply(state).reply?.type).toBe('state');
    expect(parseReply({ type: 'error', code: 'bad_message', message: 'no' }).reply?.type).toBe('error');
    expect(parseReply({ type: 'state', defaults: FACTORY_DEFAULTS, status: { state: 'stopped', engines: 0, expected: 0, ranks: [] } }).reply).not.toBeNull();
  });

  it.each([
    ['not an object', 'welcome'],
    ['an array', ['state']],
    ['null', null],
    ['unknown type', { type: 'exec', code: 'x' }],
    ['welcome without version', { ...welcome, version: 1 }],
    ['welcome with bad lists', { ...welcome, frameworks: 'pytorch' }],
    ['state with a bad framework', { ...state, defaults: { ...state.defaults, framework: 'jax' } }],
    ['state with string nodes', { ...state, defaults: { ...state.defaults, nodes: '2' } }],
    ['state with fractional nodes', { ...state, defaults: { ...state.defaults, nodes: 1.5 } }],
    ['state with bad hosts', { ...state, defaults: { ...state.defaults, hosts: 'a,b' } }],
    ['state with a bad cluster state', { ...state, status: { ...state.status, state: 'exploded' } }],
    ['state with a bad rank', { ...state, status: { ...state.status, ranks: [{ rank: 0 }] } }],
    ['state with a bad rank state', { ...state, status: { ...state.status, ranks: [{ ...state.status.ranks[0], state: 'zombie' }] } }],
    ['state without status', { type: 'state', defaults: state.defaults }],
    ['error without message', { type: 'error' }]
  ])('drops %s', (_name, data) => {
    const { reply, reason } = parseReply(data);
    expect(reply).toBeNull();
    expect(reason).toBeTruthy();
  });
});

describe('hosts', () => {
  it.each(['node1', 'gpu-07.cluster.local', '10.0.0.12', '::1', 'fe80::1:2', 'localhost'])('accepts %s', host => {
    expect(isHost(host)).toBe(true);
  });
  it.each(['a;b', '$(id)', '`id`', 'a b', '-oProxyCommand=x', '256.1.1.1', '1.2.3', 'x'.repeat(64), '', 'a_b', 'a|b'])(
    'refuses %s',
    host => {
      expect(isHost(host)).toBe(false);
    }
  );
  it('splits a host list and reports bad entries', () => {
    expect(parseHosts(' n1, n2 ,,n3 ')).toEqual({ hosts: ['n1', 'n2', 'n3'], bad: [] });
    expect(parseHosts('n1,$(id)')).toEqual({ hosts: ['n1'], bad: ['$(id)'] });
    expect(parseHosts('')).toEqual({ hosts: [], bad: [] });
  });
});
