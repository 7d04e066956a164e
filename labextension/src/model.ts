/**
 * The sidebar's state, free of JupyterLab: what phase the connection is in, the run
 * configuration shown in the controls, and the cluster status the kernel last sent.
 */

import {
  Choices,
  ClusterAction,
  ClusterStatus,
  ErrorMsg,
  FrameworkChoice,
  NO_KERNEL_CHOICES,
  RankState,
  Request,
  RunDefaults,
  STOPPED_STATUS,
  StateMsg,
  WelcomeMsg,
  choicesOf,
  parseReply,
  sameMajor
} from './protocol';

/**
 * - `no-kernel`: the active notebook has no kernel (or there is no notebook)
 * - `connecting`: comm opened, waiting for the kernel's welcome
 * - `unloaded`: the kernel has no `jupyter_dist` comm target (extension not loaded)
 * - `mismatch`: the kernel speaks another major protocol version
 * - `ready`: welcome received; the status area shows the cluster
 */
export type Phase = 'no-kernel' | 'connecting' | 'unloaded' | 'mismatch' | 'ready';

/** Which kernel shell serves the sidebar's comm (null before it opens). */
export type Transport = 'subshell' | 'main shell' | null;

/** The settings the sidebar remembers between sessions. */
export interface Remembered {
  framework: string;
  nodes: number;
  procs_per_node: number | null;
}

export const FACTORY_DEFAULTS: RunDefaults = {
  framework: 'pytorch',
  nodes: 1,
  procs_per_node: null,
  backend: 'auto',
  launcher: null,
  hosts: [],
  ib: 'auto',
  timeout: null
};

export interface GridCell {
  node: number;
  localRank: number;
  rank: number;
  host: string;
  state: RankState | 'planned';
}

const FALLBACK_PROCS = 2;

function sameDefaults(a: RunDefaults, b: RunDefaults): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

export class SidebarModel {
  private _phase: Phase = 'no-kernel';
  private _config: RunDefaults;
  private _status: ClusterStatus = STOPPED_STATUS;
  private _factory: RunDefaults = FACTORY_DEFAULTS;
  private _choices: Choices = NO_KERNEL_CHOICES;
  private _lastError: string | null = null;
  private _mismatch = '';
  private _awaitingFirstState = false;
  private _transport: Transport = null;
  private _stacks: string | null = null;
  private _stacksPending = false;
  private _listeners = new Set<() => void>();

  constructor(remembered?: Partial<Remembered>) {
    this._config = { ...FACTORY_DEFAULTS, ...(remembered ?? {}) };
  }

  get phase(): Phase {
    return this._phase;
  }
  get config(): RunDefaults {
    return this._config;
  }
  get status(): ClusterStatus {
    return this._status;
  }
  get lastError(): string | null {
    return this._lastError;
  }
  get transport(): Transport {
    return this._transport;
  }
  /** What the controls offer: the last welcome's choices (its kernel's framework registry). */
  get choices(): Choices {
    return this._choices;
  }
  /** The last stacks the kernel sent (every rank's, grouped), or null before any. */
  get stacks(): string | null {
    return this._stacks;
  }
  /** A stacks request is on its way. */
  get stacksPending(): boolean {
    return this._stacksPending;
  }
  get ready(): boolean {
    return this._phase === 'ready';
  }

  /** Call `listener` after every change; returns a function that removes it. */
  subscribe(listener: () => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  // ---------------------------------------------------------------- connection

  kernelGone(): void {
    this._status = STOPPED_STATUS;
    this._stacks = null;
    this._stacksPending = false;
    this._choices = NO_KERNEL_CHOICES;
    this._transport = null;
    this._set('no-kernel');
  }

  connecting(): void {
    this._lastError = null;
    this._choices = NO_KERNEL_CHOICES; // until this kernel's welcome says what it offers
    this._transport = null;
    this._set('connecting');
  }

  opened(transport: Exclude<Transport, null>): void {
    this._transport = transport;
    this._emit();
  }

  /** The comm could not open, the kernel closed it, or no welcome came in time. */
  notLoaded(): void {
    if (this._phase === 'mismatch') {
      return;
    }
    this._status = STOPPED_STATUS;
    this._set('unloaded');
  }

  /**
   * Handle one message from the kernel; returns requests to send back (the remembered
   * settings when this kernel still has factory defaults).
   */
  handle(data: unknown): Request[] {
    const { reply, reason } = parseReply(data);
    if (reply === null) {
      console.warn(`jupyter-dist: dropped a kernel message (${reason})`);
      return [];
    }
    switch (reply.type) {
      case 'welcome':
        return this._welcome(reply);
      case 'state':
        return this._state(reply);
      case 'stacks':
        this._stacks = reply.text;
        this._stacksPending = false;
        this._emit();
        return [];
      case 'error':
        this._stacksPending = false;
        this._error(reply);
        return [];
    }
  }

  private _welcome(msg: WelcomeMsg): Request[] {
    if (!sameMajor(msg.version)) {
      this._mismatch = `the kernel speaks protocol ${msg.version}`;
      this._set('mismatch');
      return [];
    }
    this._factory = msg.factory_defaults ?? FACTORY_DEFAULTS;
    this._choices = choicesOf(msg);
    this._awaitingFirstState = true;
    this._set('ready');
    return [];
  }

  private _state(msg: StateMsg): Request[] {
    if (this._phase !== 'ready') {
      return [];
    }
    const requests: Request[] = [];
    const first = this._awaitingFirstState;
    this._awaitingFirstState = false;
    const remembered = this.remembered();
    const fresh = first && sameDefaults(msg.defaults, this._factory);
    this._status = msg.status;
    if (fresh) {
      // a kernel nobody configured yet: give it what the user chose last time
      const changes: Partial<RunDefaults> = {};
      for (const key of ['framework', 'nodes', 'procs_per_node'] as const) {
        if (key === 'framework' && !this.offers(remembered.framework)) {
          continue; // chosen in another environment: this kernel has no such framework
        }
        if (remembered[key] !== msg.defaults[key]) {
          (changes as Record<string, unknown>)[key] = remembered[key];
        }
      }
      this._config = { ...msg.defaults, ...changes };
      if (Object.keys(changes).length > 0) {
        requests.push({ type: 'set_defaults', defaults: changes });
      }
    } else {
      this._config = { ...msg.defaults, hosts: [...msg.defaults.hosts] };
    }
    this._emit();
    return requests;
  }

  private _error(msg: ErrorMsg): void {
    if (msg.code === 'version_mismatch') {
      this._mismatch = msg.message;
      this._set('mismatch');
      return;
    }
    this._lastError = msg.message;
    this._emit();
  }

  // ---------------------------------------------------------------- user input

  /** Change some settings; returns the request that tells the kernel, if connected. */
  update(changes: Partial<RunDefaults>): Request | null {
    this._config = { ...this._config, ...changes };
    this._lastError = null;
    this._emit();
    return this.ready ? { type: 'set_defaults', defaults: changes } : null;
  }

  action(action: ClusterAction): Request | null {
    return this.ready ? { type: 'cluster', action } : null;
  }

  /** Ask for every rank's stack (the Stacks button); null when not connected. */
  askStacks(): Request | null {
    if (!this.ready) {
      return null;
    }
    this._stacksPending = true;
    this._lastError = null;
    this._emit();
    return { type: 'stacks' };
  }

  /** Settings loaded from the registry; the kernel's store wins once connected. */
  remember(values: Partial<Remembered>): void {
    if (!this.ready) {
      this._config = { ...this._config, ...values };
      this._emit();
    }
  }

  remembered(): Remembered {
    const { framework, nodes, procs_per_node } = this._config;
    return { framework, nodes, procs_per_node };
  }

  // ---------------------------------------------------------------- views

  /** Whether the connected kernel offers this framework. */
  offers(framework: string): boolean {
    return this._choices.frameworks.some(choice => choice.name === framework);
  }

  /** The framework select's entries: the kernel's, and the configured one where it has none such
   * (before a kernel connects, the remembered framework). */
  frameworkChoices(): FrameworkChoice[] {
    const framework = this._config.framework;
    const choices = this._choices.frameworks;
    return this.offers(framework) ? choices : [...choices, { name: framework, title: framework }];
  }

  /** World size of the configured run; null while procs per node is "auto". */
  get worldSize(): number | null {
    const procs = this._config.procs_per_node;
    return procs === null ? null : this._config.nodes * procs;
  }

  /** Rows of the node x local-rank grid: the running cluster's ranks, else the configured layout. */
  grid(): GridCell[][] {
    const status = this._status;
    if (status.ranks.length > 0) {
      const nodes = 1 + Math.max(...status.ranks.map(r => r.node));
      const procs = 1 + Math.max(...status.ranks.map(r => r.local_rank));
      const rows: GridCell[][] = [];
      for (let node = 0; node < nodes; node++) {
        const row: GridCell[] = [];
        for (let local = 0; local < procs; local++) {
          const found = status.ranks.find(r => r.node === node && r.local_rank === local);
          row.push({
            node,
            localRank: local,
            rank: found?.rank ?? node * procs + local,
            host: found?.host ?? '',
            state: found?.state ?? 'dead'
          });
        }
        rows.push(row);
      }
      return rows;
    }
    const procs = this._config.procs_per_node ?? FALLBACK_PROCS;
    const hosts = this._config.hosts;
    return Array.from({ length: this._config.nodes }, (_, node) =>
      Array.from({ length: procs }, (_, local) => ({
        node,
        localRank: local,
        rank: node * procs + local,
        host: hosts[node] ?? '',
        state: 'planned' as const
      }))
    );
  }

  /** One line for the status area. */
  headline(): string {
    switch (this._phase) {
      case 'no-kernel':
        return 'no kernel';
      case 'connecting':
        return 'connecting to the kernel…';
      case 'unloaded':
        return 'run %load_ext jupyter_dist in this notebook';
      case 'mismatch':
        return `version mismatch: ${this._mismatch}`;
      case 'ready': {
        const s = this._status;
        const engines = `${s.engines}/${s.expected} engines`;
        const framework = s.framework ? `, ${s.framework}` : '';
        const message = s.message ? ` — ${s.message}` : '';
        return `cluster ${s.state} (${engines}${framework})${message}`;
      }
    }
  }

  private _set(phase: Phase): void {
    this._phase = phase;
    this._emit();
  }

  private _emit(): void {
    for (const listener of [...this._listeners]) {
      listener();
    }
  }
}
