import { FACTORY_DEFAULTS, SidebarModel } from '../model';
import { BACKENDS, ClusterStatus, IB_MODES, LAUNCHERS, NO_KERNEL_CHOICES, RunDefaults, STOPPED_STATUS } from '../protocol';

const welcome = {
  type: 'welcome',
  version: '1.1',
  frameworks: ['pytorch', 'mpi', 'deepspeed', 'jax'],
  framework_titles: { pytorch: 'PyTorch DDP', mpi: 'MPI', deepspeed: 'DeepSpeed', jax: 'JAX (a plugin)' },
  backends: [...BACKENDS],
  launchers: [...LAUNCHERS],
  ib_modes: [...IB_MODES],
  actions: ['start', 'stop', 'restart'],
  factory_defaults: FACTORY_DEFAULTS
};

function stateMsg(defaults: Partial<RunDefaults> = {}, status: ClusterStatus = STOPPED_STATUS) {
  return { type: 'state', defaults: { ...FACTORY_DEFAULTS, ...defaults }, status };
}

function readyModel(defaults: Partial<RunDefaults> = { nodes: 3 }): SidebarModel {
  const model = new SidebarModel();
  model.connecting();
  model.handle(welcome);
  model.handle(stateMsg(defaults));
  return model;
}

beforeEach(() => {
  jest.spyOn(console, 'warn').mockImplementation(() => undefined);
});

describe('the connection state machine', () => {
  it('starts with no kernel', () => {
    const model = new SidebarModel();
    expect(model.phase).toBe('no-kernel');
    expect(model.headline()).toBe('no kernel');
  });

  it('goes connecting -> ready on welcome', () => {
    const model = new SidebarModel();
    const seen: string[] = [];
    model.subscribe(() => seen.push(model.phase));
    model.connecting();
    expect(model.headline()).toMatch(/connecting/);
    model.handle(welcome);
    expect(model.phase).toBe('ready');
    expect(seen).toEqual(['connecting', 'ready']);
    expect(model.headline()).toBe('cluster stopped (0/0 engines)');
  });

  it('shows the load_ext hint when the target is missing, not an error', () => {
    const model = new SidebarModel();
    model.connecting();
    model.notLoaded();
    expect(model.phase).toBe('unloaded');
    expect(model.headline()).toBe('run %load_ext jupyter_dist in this notebook');
    expect(model.lastError).toBeNull();
  });

  it('recovers when a late welcome arrives after the timeout', () => {
    const model = new SidebarModel();
    model.connecting();
    model.notLoaded();
    model.handle(welcome);
    expect(model.phase).toBe('ready');
  });

  it('reports a version mismatch from a welcome or from an error', () => {
    const a = new SidebarModel();
    a.connecting();
    a.handle({ ...welcome, version: '2.0' });
    expect(a.phase).toBe('mismatch');
    expect(a.headline()).toMatch(/^version mismatch/);
    a.notLoaded(); // a following comm close keeps the mismatch visible
    expect(a.phase).toBe('mismatch');

    const b = new SidebarModel();
    b.connecting();
    b.handle({ type: 'error', code: 'version_mismatch', message: 'kernel speaks 1.0, sidebar 2.0' });
    expect(b.phase).toBe('mismatch');
    expect(b.headline()).toMatch(/kernel speaks 1.0/);
  });

  it('keeps other errors as a message, staying ready', () => {
    const model = readyModel();
    model.handle({ type: 'error', code: 'action_failed', message: 'cluster start failed: boom' });
    expect(model.phase).toBe('ready');
    expect(model.lastError).toBe('cluster start failed: boom');
  });

  it('drops malformed messages without changing state', () => {
    const model = readyModel();
    const before = model.config;
    expect(model.handle({ type: 'state', defaults: { nodes: 'x' } })).toEqual([]);
    expect(model.handle('nonsense')).toEqual([]);
    expect(model.config).toBe(before);
  });

  it('ignores states before the welcome', () => {
    const model = new SidebarModel();
    model.connecting();
    model.handle(stateMsg({ nodes: 7 }));
    expect(model.config.nodes).toBe(1);
  });

  it('goes back to no kernel and forgets the cluster', () => {
    const model = readyModel();
    model.handle(stateMsg({ nodes: 3 }, { ...STOPPED_STATUS, state: 'idle', engines: 2, expected: 2 }));
    model.kernelGone();
    expect(model.phase).toBe('no-kernel');
    expect(model.status).toEqual(STOPPED_STATUS);
  });
});

describe('defaults and settings', () => {
  it('adopts the kernel store when it was configured already', () => {
    const model = new SidebarModel({ framework: 'mpi', nodes: 4, procs_per_node: 8 });
    model.connecting();
    model.handle(welcome);
    expect(model.handle(stateMsg({ framework: 'deepspeed', nodes: 2 }))).toEqual([]);
    expect(model.config.framework).toBe('deepspeed');
    expect(model.config.nodes).toBe(2);
  });

  it('pushes the remembered settings into a fresh kernel', () => {
    const model = new SidebarModel();
    model.remember({ framework: 'mpi', nodes: 2, procs_per_node: 2 });
    model.connecting();
    model.handle(welcome);
    const requests = model.handle(stateMsg());
    expect(requests).toEqual([
      { type: 'set_defaults', defaults: { framework: 'mpi', nodes: 2, procs_per_node: 2 } }
    ]);
    expect(model.config.framework).toBe('mpi');
    // later states are just adopted
    expect(model.handle(stateMsg())).toEqual([]);
    expect(model.config.framework).toBe('pytorch');
  });

  it('turns user changes into set_defaults only when connected', () => {
    const model = new SidebarModel();
    expect(model.update({ nodes: 2 })).toBeNull();
    expect(model.config.nodes).toBe(2);
    const ready = readyModel();
    expect(ready.update({ nodes: 2, hosts: ['a', 'b'] })).toEqual({
      type: 'set_defaults',
      defaults: { nodes: 2, hosts: ['a', 'b'] }
    });
    expect(ready.remembered()).toEqual({ framework: 'pytorch', nodes: 2, procs_per_node: null });
  });

  it('makes cluster requests only when connected', () => {
    expect(new SidebarModel().action('start')).toBeNull();
    expect(readyModel().action('restart')).toEqual({ type: 'cluster', action: 'restart' });
  });

  it('does not let remembered settings override a connected kernel', () => {
    const model = readyModel({ nodes: 3 });
    model.remember({ nodes: 9 });
    expect(model.config.nodes).toBe(3);
  });
});

describe('choices', () => {
  it('has no frameworks before a kernel says which it offers', () => {
    const model = new SidebarModel({ framework: 'mpi' });
    expect(model.choices).toEqual(NO_KERNEL_CHOICES);
    expect(model.frameworkChoices()).toEqual([{ name: 'mpi', title: 'mpi' }]); // the remembered one
  });

  it('takes the choices from the welcome, titles included', () => {
    const model = new SidebarModel();
    const seen: string[][] = [];
    model.subscribe(() => seen.push(model.frameworkChoices().map(choice => choice.title)));
    model.connecting();
    model.handle(welcome);
    expect(model.choices.frameworks.map(choice => choice.name)).toEqual(['pytorch', 'mpi', 'deepspeed', 'jax']);
    expect(model.frameworkChoices()).toContainEqual({ name: 'jax', title: 'JAX (a plugin)' });
    expect(model.choices.backends).toEqual([...BACKENDS]);
    expect(seen[seen.length - 1]).toEqual(['PyTorch DDP', 'MPI', 'DeepSpeed', 'JAX (a plugin)']);
  });

  it('offers a framework the kernel registered through its entry point', () => {
    const model = readyModel();
    expect(model.update({ framework: 'jax' })).toEqual({ type: 'set_defaults', defaults: { framework: 'jax' } });
    model.handle(stateMsg({ framework: 'jax' }));
    expect(model.config.framework).toBe('jax');
    expect(model.frameworkChoices().map(choice => choice.name)).toEqual(['pytorch', 'mpi', 'deepspeed', 'jax']);
  });

  it('shows what another kernel offers once it connects', () => {
    const model = readyModel();
    model.kernelGone();
    expect(model.choices.frameworks).toEqual([]);
    model.connecting();
    model.handle({ ...welcome, frameworks: ['pytorch', 'horovod'], framework_titles: { horovod: 'Horovod' } });
    expect(model.frameworkChoices()).toEqual([
      { name: 'pytorch', title: 'pytorch' },
      { name: 'horovod', title: 'Horovod' }
    ]);
  });

  it('does not push a remembered framework this kernel lacks', () => {
    const model = new SidebarModel();
    model.remember({ framework: 'tensorflow', nodes: 2 });
    model.connecting();
    model.handle(welcome);
    expect(model.handle(stateMsg())).toEqual([{ type: 'set_defaults', defaults: { nodes: 2 } }]);
    expect(model.config.framework).toBe('pytorch');
  });
});

describe('world size and grid', () => {
  it('computes the world size, or auto', () => {
    const model = new SidebarModel();
    expect(model.worldSize).toBeNull();
    model.update({ nodes: 2, procs_per_node: 3 });
    expect(model.worldSize).toBe(6);
  });

  it('lays out the configured ranks as node x local rank', () => {
    const model = new SidebarModel({ nodes: 2, procs_per_node: 2 });
    model.update({ hosts: ['h0', 'h1'] });
    const grid = model.grid();
    expect(grid.map(row => row.map(cell => cell.rank))).toEqual([
      [0, 1],
      [2, 3]
    ]);
    expect(grid[1][0]).toEqual({ node: 1, localRank: 0, rank: 2, host: 'h1', state: 'planned' });
  });

  it('shows the running cluster ranks with their states', () => {
    const model = readyModel();
    const ranks = [
      { rank: 0, node: 0, local_rank: 0, host: 'a', state: 'busy' as const },
      { rank: 1, node: 0, local_rank: 1, host: 'a', state: 'idle' as const },
      { rank: 2, node: 1, local_rank: 0, host: 'b', state: 'dead' as const },
      { rank: 3, node: 1, local_rank: 1, host: 'b', state: 'starting' as const }
    ];
    model.handle(
      stateMsg({}, { state: 'busy', engines: 3, expected: 4, framework: 'pytorch', nodes: 2, procs_per_node: 2, ranks })
    );
    expect(model.grid().map(row => row.map(cell => cell.state))).toEqual([
      ['busy', 'idle'],
      ['dead', 'starting']
    ]);
    expect(model.headline()).toBe('cluster busy (3/4 engines, pytorch)');
  });
});

describe('the Stacks button', () => {
  const busy: ClusterStatus = {
    state: 'busy',
    engines: 2,
    expected: 2,
    ranks: [0, 1].map(rank => ({ rank, node: 0, local_rank: rank, host: 'h', state: 'busy' as const }))
  };

  it('asks only when connected, and shows the kernel text', () => {
    const idle = new SidebarModel();
    expect(idle.askStacks()).toBeNull();
    const model = readyModel();
    model.handle(stateMsg({ nodes: 3 }, busy));
    expect(model.askStacks()).toEqual({ type: 'stacks' });
    expect(model.stacksPending).toBe(true);
    model.handle({ type: 'stacks', text: 'ranks 0,1: time.sleep at <cell>:3' });
    expect(model.stacksPending).toBe(false);
    expect(model.stacks).toBe('ranks 0,1: time.sleep at <cell>:3');
  });

  it('an error ends the wait; a malformed reply is dropped; a kernel gone forgets them', () => {
    const model = readyModel();
    model.askStacks();
    model.handle({ type: 'stacks', text: 7 });
    expect(model.stacksPending).toBe(true);
    model.handle({ type: 'error', code: 'action_failed', message: 'no cluster yet' });
    expect(model.stacksPending).toBe(false);
    expect(model.lastError).toBe('no cluster yet');
    model.handle({ type: 'stacks', text: 'x' });
    model.kernelGone();
    expect(model.stacks).toBeNull();
  });
});
