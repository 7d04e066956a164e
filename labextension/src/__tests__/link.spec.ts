import type { Kernel } from '@jupyterlab/services';

import { KernelLink, WELCOME_TIMEOUT_MS } from '../link';
import { FACTORY_DEFAULTS, SidebarModel } from '../model';
import { PROTOCOL_VERSION, STOPPED_STATUS } from '../protocol';
import { FakeKernel } from './fakes';

const welcome = {
  type: 'welcome',
  version: '1.0',
  frameworks: [],
  backends: [],
  launchers: [],
  ib_modes: [],
  actions: []
};

async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await Promise.resolve();
  }
}

function setup(subshells: boolean) {
  const kernel = new FakeKernel(subshells);
  const model = new SidebarModel();
  const link = new KernelLink(kernel as unknown as Kernel.IKernelConnection, model);
  return { kernel, model, link };
}

beforeEach(() => {
  jest.useFakeTimers();
  jest.spyOn(console, 'warn').mockImplementation(() => undefined);
});
afterEach(() => jest.useRealTimers());

describe('KernelLink', () => {
  it('waits for the subshell before opening, then says hello', async () => {
    const { kernel, model, link } = setup(true);
    const started = link.start();
    await flush();
    const comm = kernel.comms[0];
    expect(comm.opened).toEqual([]); // not yet: it would go to the main shell
    comm.startSubshell('sub-1');
    await started;
    expect(comm.opened).toEqual([{ type: 'hello', version: PROTOCOL_VERSION }]);
    expect(link.subshellId).toBe('sub-1');
    expect(model.transport).toBe('subshell');
    comm.reply(welcome);
    expect(model.phase).toBe('ready');
  });

  it('opens on the main shell when the kernel has no subshells', async () => {
    const { kernel, model, link } = setup(false);
    await link.start();
    expect(kernel.comms[0].opened).toHaveLength(1);
    expect(link.subshellId).toBeNull();
    expect(model.transport).toBe('main shell');
    expect(model.phase).toBe('connecting');
  });

  it('shows "not loaded" when the kernel closes the comm (no such target)', async () => {
    const { kernel, model, link } = setup(false);
    await link.start();
    kernel.comms[0].onClose({});
    expect(model.phase).toBe('unloaded');
  });

  it('shows "not loaded" when no welcome comes within the timeout', async () => {
    const { model, link } = setup(false);
    await link.start();
    jest.advanceTimersByTime(WELCOME_TIMEOUT_MS + 10);
    expect(model.phase).toBe('unloaded');
  });

  it('reconnects when the kernel announces the target (after %load_ext)', async () => {
    const { kernel, model, link } = setup(false);
    await link.start();
    kernel.comms[0].onClose({});
    expect(model.phase).toBe('unloaded');
    kernel.targets.get('jupyter_dist')!();
    await flush();
    expect(kernel.comms).toHaveLength(2);
    kernel.comms[1].reply(welcome);
    kernel.comms[1].reply({ type: 'state', defaults: FACTORY_DEFAULTS, status: STOPPED_STATUS });
    expect(model.phase).toBe('ready');
  });

  it('sends requests and the remembered settings over the comm', async () => {
    const { kernel, model, link } = setup(false);
    model.remember({ nodes: 2 });
    await link.start();
    const comm = kernel.comms[0];
    comm.reply(welcome);
    comm.reply({ type: 'state', defaults: FACTORY_DEFAULTS, status: STOPPED_STATUS });
    expect(comm.sent).toEqual([{ type: 'set_defaults', defaults: { nodes: 2 } }]);
    link.send({ type: 'get_state' });
    expect(comm.sent).toHaveLength(2);
  });

  it('ignores a disposed link and closes its comm', async () => {
    const { kernel, model, link } = setup(false);
    await link.start();
    const comm = kernel.comms[0];
    link.dispose();
    expect(comm.isDisposed).toBe(true);
    expect(kernel.targets.size).toBe(0);
    comm.reply(welcome);
    expect(model.phase).toBe('connecting');
  });
});
