import type { INotebookTracker } from '@jupyterlab/notebook';
import { Signal } from '@lumino/signaling';

import { NotebookFollower } from '../follow';
import { SidebarModel } from '../model';
import { FakeKernel } from './fakes';

class FakeContext {
  kernelChanged = new Signal<this, unknown>(this);
  statusChanged = new Signal<this, string>(this);
  session: { kernel: FakeKernel | null } | null;
  constructor(kernel: FakeKernel | null) {
    this.session = { kernel };
  }
  setKernel(kernel: FakeKernel | null): void {
    this.session = { kernel };
    this.kernelChanged.emit({});
  }
}

class FakeTracker {
  currentChanged = new Signal<this, unknown>(this);
  currentWidget: { sessionContext: FakeContext } | null = null;
  show(context: FakeContext | null): void {
    this.currentWidget = context ? { sessionContext: context } : null;
    this.currentChanged.emit(this.currentWidget);
  }
}

async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await Promise.resolve();
  }
}

function setup() {
  const tracker = new FakeTracker();
  const model = new SidebarModel();
  const follower = new NotebookFollower(tracker as unknown as INotebookTracker, model);
  return { tracker, model, follower };
}

beforeEach(() => {
  jest.useFakeTimers();
  jest.spyOn(console, 'warn').mockImplementation(() => undefined);
});
afterEach(() => jest.useRealTimers());

describe('NotebookFollower', () => {
  it('shows no kernel without a notebook or kernel', () => {
    const { tracker, model } = setup();
    expect(model.phase).toBe('no-kernel');
    tracker.show(new FakeContext(null));
    expect(model.phase).toBe('no-kernel');
  });

  it('opens a comm on the active notebook kernel and follows notebook switches', async () => {
    const { tracker, model, follower } = setup();
    const a = new FakeKernel(false);
    const b = new FakeKernel(false);
    tracker.show(new FakeContext(a));
    await flush();
    expect(a.comms).toHaveLength(1);
    expect(model.phase).toBe('connecting');
    tracker.show(new FakeContext(b));
    await flush();
    expect(a.comms[0].isDisposed).toBe(true); // closed when the notebook is left
    expect(b.comms).toHaveLength(1);
    tracker.show(null);
    expect(model.phase).toBe('no-kernel');
    follower.dispose();
  });

  it('relinks on a kernel change', async () => {
    const { tracker, model } = setup();
    const context = new FakeContext(new FakeKernel(false));
    tracker.show(context);
    const next = new FakeKernel(false);
    context.setKernel(next);
    await flush();
    expect(next.comms).toHaveLength(1);
    context.setKernel(null);
    expect(model.phase).toBe('no-kernel');
  });

  it('waits out a restart: gone, then relinks once the new kernel is idle', async () => {
    const { tracker, model } = setup();
    const kernel = new FakeKernel(false);
    const context = new FakeContext(kernel);
    tracker.show(context);
    await flush();
    context.statusChanged.emit('restarting');
    expect(model.phase).toBe('no-kernel');
    context.statusChanged.emit('idle'); // the old kernel's last word: not yet
    await flush();
    expect(kernel.comms).toHaveLength(1);
    context.statusChanged.emit('starting');
    context.statusChanged.emit('idle');
    await flush();
    expect(kernel.comms).toHaveLength(2);
    expect(model.phase).toBe('connecting');
  });
});
