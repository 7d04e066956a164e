import {
  PROTOCOL_VERSION,
  WelcomeMsg,
  choicesOf,
  hello,
  isHost,
  parseHosts,
  parseReply,
  sameMajor
} from '../protocol';
import { FACTORY_DEFAULTS } from '../model';

const welcome = {
  type: 'welcome',
  version: '1.1',
  frameworks: ['pytorch', 'mpi'],
  framework_titles: { pytorch: 'PyTorch DDP', mpi: 'MPI' },
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
    expect(parseReply({ type: 'stacks', text: 'ranks 0,1: sleep at <cell>:3' }).reply?.type).toBe('stacks');
    expect(parseReply({ type: 'stacks', text: ['no'] }).reply).toBeNull();
    expect(parseReply({ type: 'state', defaults: FACTORY_DEFAULTS, status: { state: 'stopped', engines: 0, expected: 0, ranks: [] } }).reply).not.toBeNull();
  });

  it.each([
    ['not an object', 'welcome'],
    ['an array', ['state']],
    ['null', null],
    ['unknown type', { type: 'exec', code: 'x' }],
    ['welcome without version', { ...welcome, version: 1 }],
    ['welcome with bad lists', { ...welcome, frameworks: 'pytorch' }],
    ['welcome with an empty framework name', { ...welcome, frameworks: ['pytorch', ''] }],
    ['welcome with bad titles', { ...welcome, framework_titles: { pytorch: 1 } }],
    ['welcome with titles as a list', { ...welcome, framework_titles: ['PyTorch DDP'] }],
    ['state with a non-string framework', { ...state, defaults: { ...state.defaults, framework: 1 } }],
    ['state with an empty framework', { ...state, defaults: { ...state.defaults, framework: '' } }],
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

describe('framework choices', () => {
  it('accepts any framework the kernel registered, not a fixed list', () => {
    const plugin = { ...welcome, frameworks: ['pytorch', 'jax'], framework_titles: { jax: 'JAX' } };
    expect(parseReply(plugin).reply?.type).toBe('welcome');
    expect(parseReply({ ...state, defaults: { ...state.defaults, framework: 'jax' } }).reply?.type).toBe('state');
  });

  it('pairs names with titles, the name standing in for a missing one', () => {
    const plugin = { ...welcome, frameworks: ['pytorch', 'jax', 'constructor'], framework_titles: { pytorch: 'PyTorch DDP' } };
    expect(choicesOf(plugin as WelcomeMsg).frameworks).toEqual([
      { name: 'pytorch', title: 'PyTorch DDP' },
      { name: 'jax', title: 'jax' },
      { name: 'constructor', title: 'constructor' }
    ]);
  });

  it('reads a 1.0 welcome, which has no titles', () => {
    const old = { ...welcome, version: '1.0', framework_titles: undefined };
    const { reply } = parseReply(old);
    expect(reply?.type).toBe('welcome');
    expect(choicesOf(reply as WelcomeMsg)).toEqual({
      frameworks: [
        { name: 'pytorch', title: 'pytorch' },
        { name: 'mpi', title: 'mpi' }
      ],
      backends: welcome.backends,
      launchers: welcome.launchers,
      ib_modes: welcome.ib_modes
    });
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
