/**
 * Keep the sidebar on the active notebook's kernel: follow the notebook tracker, the
 * session's kernel changes and the kernel's restarts, with one `KernelLink` at a time.
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import type { Kernel } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';

import { KernelLink } from './link';
import { SidebarModel } from './model';
import { Request } from './protocol';

const GONE: ReadonlySet<Kernel.Status> = new Set(['restarting', 'autorestarting', 'dead', 'terminating']);
const COMING: ReadonlySet<Kernel.Status> = new Set(['starting', 'unknown']);

/**
 * Where a restart is: `gone` after restarting/dead (the old kernel may still report a last
 * busy/idle), `coming` once the new one starts; its first `idle` relinks.
 */
type Restart = 'none' | 'gone' | 'coming';

export class NotebookFollower implements IDisposable {
  private _context: ISessionContext | null = null;
  private _link: KernelLink | null = null;
  private _restart: Restart = 'none';
  private _disposed = false;

  constructor(
    private readonly _tracker: INotebookTracker,
    private readonly _model: SidebarModel
  ) {
    _tracker.currentChanged.connect(this._onCurrent, this);
    this._onCurrent(_tracker, _tracker.currentWidget);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  get link(): KernelLink | null {
    return this._link;
  }

  send(request: Request | null): void {
    if (request !== null) {
      this._link?.send(request);
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._tracker.currentChanged.disconnect(this._onCurrent, this);
    this._follow(null);
  }

  private _onCurrent(_tracker: INotebookTracker, panel: NotebookPanel | null): void {
    this._follow(panel?.sessionContext ?? null);
  }

  private _follow(context: ISessionContext | null): void {
    if (this._context) {
      this._context.kernelChanged.disconnect(this._relink, this);
      this._context.statusChanged.disconnect(this._onStatus, this);
    }
    this._context = context;
    if (context) {
      context.kernelChanged.connect(this._relink, this);
      context.statusChanged.connect(this._onStatus, this);
    }
    this._relink();
  }

  private _relink(): void {
    this._restart = 'none';
    this._link?.dispose();
    this._link = null;
    const kernel = this._disposed ? null : (this._context?.session?.kernel ?? null);
    if (kernel === null) {
      this._model.kernelGone();
      return;
    }
    this._link = new KernelLink(kernel, this._model);
    void this._link.start();
  }

  private _onStatus(_context: ISessionContext, status: Kernel.Status): void {
    if (GONE.has(status)) {
      if (this._restart === 'none') {
        this._link?.dispose();
        this._link = null;
        this._model.kernelGone();
      }
      this._restart = 'gone';
    } else if (this._restart === 'gone' && COMING.has(status)) {
      this._restart = 'coming';
    } else if (this._restart === 'coming' && status === 'idle') {
      this._relink();
    }
  }
}
