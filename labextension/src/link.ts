/**
 * One comm between the sidebar and one kernel connection.
 *
 * The comm travels over a kernel subshell when the kernel supports them (JEP 91):
 * @jupyterlab/services 7.6 creates one subshell per comm target for `createComm` by
 * default, so the only thing to do is to wait for it before `open()`; otherwise `open()`
 * would go to the main shell and the kernel would answer only after the running cell.
 */

import type { JSONObject } from '@lumino/coreutils';
import type { IDisposable } from '@lumino/disposable';
import { CommsOverSubshells, Kernel, KernelMessage } from '@jupyterlab/services';

import { SidebarModel } from './model';
import { Request, TARGET_NAME, hello } from './protocol';

export const WELCOME_TIMEOUT_MS = 2000;
const SUBSHELL_TIMEOUT_MS = 5000;

/** What `CommHandler` offers beyond `Kernel.IComm` in @jupyterlab/services 7.6. */
interface SubshellComm {
  subshellStarted?: Promise<void>;
  subshellId?: string | null;
}

function delay(ms: number): Promise<'timeout'> {
  return new Promise(resolve => setTimeout(() => resolve('timeout'), ms));
}

export class KernelLink implements IDisposable {
  private _comm: Kernel.IComm | null = null;
  private _generation = 0;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _disposed = false;

  constructor(
    private readonly _kernel: Kernel.IKernelConnection,
    private readonly _model: SidebarModel
  ) {}

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** The subshell the comm uses, or null for the main shell. */
  get subshellId(): string | null {
    return (this._comm as SubshellComm | null)?.subshellId ?? null;
  }

  async start(): Promise<void> {
    this._model.connecting();
    // `%load_ext jupyter_dist` opens (and closes) a comm to this target: then reconnect.
    this._kernel.registerCommTarget(TARGET_NAME, this._onAnnounce);
    await this.open();
  }

  async open(): Promise<void> {
    const generation = ++this._generation;
    this._closeComm();
    this._model.connecting();
    let comm: Kernel.IComm;
    try {
      await this._kernel.info;
      if (this._stale(generation)) {
        return;
      }
      comm = this._kernel.createComm(TARGET_NAME);
    } catch (err) {
      console.warn('jupyter-dist: cannot create the comm', err);
      this._model.notLoaded();
      return;
    }
    this._comm = comm;
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => {
      if (!this._stale(generation)) {
        this._clearTimer();
        for (const request of this._model.handle(msg.content.data)) {
          this.send(request);
        }
      }
    };
    comm.onClose = () => {
      if (!this._stale(generation) && this._comm === comm) {
        this._comm = null;
        this._clearTimer();
        this._model.notLoaded();
      }
    };
    const subshell = (comm as SubshellComm).subshellStarted;
    if (
      subshell &&
      this._kernel.supportsSubshells &&
      comm.commsOverSubshells !== CommsOverSubshells.Disabled
    ) {
      const outcome = await Promise.race([subshell.catch(() => 'failed' as const), delay(SUBSHELL_TIMEOUT_MS)]);
      if (outcome !== undefined) {
        console.warn(`jupyter-dist: no subshell (${outcome}); using the main shell`);
      }
      if (this._stale(generation)) {
        return;
      }
    }
    this._model.opened(this.subshellId ? 'subshell' : 'main shell');
    this._timer = setTimeout(() => {
      if (!this._stale(generation) && this._model.phase === 'connecting') {
        this._model.notLoaded();
      }
    }, WELCOME_TIMEOUT_MS);
    try {
      comm.open(hello() as unknown as JSONObject);
    } catch (err) {
      console.warn('jupyter-dist: cannot open the comm', err);
      this._clearTimer();
      this._model.notLoaded();
    }
  }

  send(request: Request): void {
    const comm = this._comm;
    if (comm === null || comm.isDisposed || this._kernel.isDisposed) {
      return;
    }
    try {
      comm.send(request as unknown as JSONObject);
    } catch (err) {
      console.warn('jupyter-dist: cannot send', err);
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._generation++;
    this._clearTimer();
    this._closeComm();
    if (!this._kernel.isDisposed) {
      this._kernel.removeCommTarget(TARGET_NAME, this._onAnnounce);
    }
  }

  private _onAnnounce = (): void => {
    if (!this._disposed && !this._model.ready) {
      void this.open();
    }
  };

  private _stale(generation: number): boolean {
    return this._disposed || generation !== this._generation;
  }

  private _clearTimer(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _closeComm(): void {
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed && !this._kernel.isDisposed) {
      try {
        comm.close();
      } catch {
        // the kernel went away; nothing to close
      }
    }
  }
}
