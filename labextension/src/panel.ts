/** The left-sidebar widget: run controls, layout grid, cluster status and actions. */

import { Widget } from '@lumino/widgets';

import { GridCell, SidebarModel } from './model';
import { CLUSTER_ACTIONS, ClusterAction, RunDefaults, parseHosts } from './protocol';

export const SIDEBAR_ID = 'jupyter-dist:sidebar';

export interface SidebarCallbacks {
  update(changes: Partial<RunDefaults>): void;
  action(action: ClusterAction): void;
  insertCell(): void;
  stacks(): void;
}

type Field = HTMLInputElement | HTMLSelectElement;
type SelectKey = 'framework' | 'backend' | 'launcher' | 'ib';
/** A select's entries: [value, label]. */
type Options = [string, string][];

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** An empty select; its entries come from the kernel's choices (`setOptions`). */
function select(name: string): HTMLSelectElement {
  const node = el('select', 'jp-dist-input');
  node.name = name;
  return node;
}

/** Replace a select's entries when they changed, keeping its value where it is still offered. */
function setOptions(node: HTMLSelectElement, options: Options): void {
  const key = JSON.stringify(options);
  if (node.dataset.options === key) {
    return;
  }
  const value = node.value;
  node.replaceChildren(...options.map(([optionValue, label]) => new Option(label, optionValue)));
  node.dataset.options = key;
  node.value = value;
}

function plain(choices: readonly string[]): Options {
  return choices.map(choice => [choice, choice]);
}

function numberInput(name: string, placeholder: string, min: number): HTMLInputElement {
  const node = el('input', 'jp-dist-input');
  node.type = 'number';
  node.name = name;
  node.min = String(min);
  node.step = '1';
  node.placeholder = placeholder;
  return node;
}

/** Parse a positive integer field; undefined when invalid, null when empty and allowed. */
function positiveInt(text: string, nullable: boolean): number | null | undefined {
  if (text.trim() === '') {
    return nullable ? null : undefined;
  }
  const value = Number(text);
  return Number.isInteger(value) && value >= 1 ? value : undefined;
}

export class DistSidebar extends Widget {
  private _fields: Record<keyof RunDefaults, Field>;
  private _world = el('div', 'jp-dist-world');
  private _grid = el('div', 'jp-dist-grid');
  private _headline = el('div', 'jp-dist-headline');
  private _error = el('div', 'jp-dist-error');
  private _ranks = el('ul', 'jp-dist-ranks');
  private _transport = el('div', 'jp-dist-transport');
  private _buttons: Record<ClusterAction, HTMLButtonElement>;
  private _stacksButton = el('button', 'jp-Button jp-mod-styled jp-dist-button jp-dist-stacks-button', 'Stacks');
  private _stacks = el('pre', 'jp-dist-stacks');
  private _unsubscribe: () => void;

  constructor(
    private readonly _model: SidebarModel,
    private readonly _callbacks: SidebarCallbacks
  ) {
    super();
    this.id = SIDEBAR_ID;
    this.addClass('jp-dist-sidebar');
    this.title.caption = 'Distributed runs (jupyter-dist)';

    this._fields = {
      framework: select('framework'),
      nodes: numberInput('nodes', '1', 1),
      procs_per_node: numberInput('procs_per_node', 'auto (GPUs, else 2)', 1),
      backend: select('backend'),
      launcher: select('launcher'),
      hosts: Object.assign(el('input', 'jp-dist-input'), {
        type: 'text',
        name: 'hosts',
        placeholder: 'this host (comma-separated)'
      }),
      ib: select('ib'),
      timeout: Object.assign(numberInput('timeout', 'none (seconds)', 1), { step: 'any' })
    };
    const labels: Record<keyof RunDefaults, string> = {
      framework: 'Framework',
      nodes: 'Nodes',
      procs_per_node: 'Procs per node',
      backend: 'Backend',
      launcher: 'Launcher',
      hosts: 'Hosts',
      ib: 'InfiniBand',
      timeout: 'Timeout'
    };

    const hints: Record<keyof RunDefaults, string> = {
      framework: '-f / --framework',
      nodes: '-N / --nodes',
      procs_per_node: '-n / --procs-per-node; empty: GPUs per node, else 2',
      backend: '--backend; auto: nccl with enough CUDA GPUs, else gloo',
      launcher: '--launcher; auto: mpi when mpiexec is found, else local',
      hosts: '--hosts: comma-separated host names or IP addresses, one per node',
      ib: '--ib: InfiniBand',
      timeout: '--timeout: seconds before the run is declared hung; empty: none'
    };
    const header = el('h2', 'jp-dist-title', 'Distributed run');
    const form = el('div', 'jp-dist-form');
    for (const key of Object.keys(this._fields) as (keyof RunDefaults)[]) {
      const field = this._fields[key];
      field.title = hints[key];
      const label = el('label', 'jp-dist-label');
      label.appendChild(el('span', 'jp-dist-label-text', labels[key]));
      label.appendChild(field);
      form.appendChild(label);
      field.addEventListener('change', () => this._onField(key));
    }

    const actions = el('div', 'jp-dist-actions');
    const names: Record<ClusterAction, string> = { start: 'Start', stop: 'Stop', restart: 'Restart' };
    this._buttons = {} as Record<ClusterAction, HTMLButtonElement>;
    for (const action of CLUSTER_ACTIONS) {
      const button = el('button', 'jp-Button jp-mod-styled jp-dist-button', names[action]);
      button.dataset.action = action;
      button.addEventListener('click', () => this._callbacks.action(action));
      this._buttons[action] = button;
      actions.appendChild(button);
    }
    this._stacksButton.title = "every rank's stack and collective, now (%dist stacks)";
    this._stacksButton.addEventListener('click', () => this._callbacks.stacks());
    actions.appendChild(this._stacksButton);
    const insert = el('button', 'jp-Button jp-mod-styled jp-mod-accept jp-dist-insert', 'Insert %%distrun cell');
    insert.addEventListener('click', () => this._callbacks.insertCell());

    const status = el('div', 'jp-dist-status');
    status.setAttribute('aria-live', 'polite');
    status.append(this._headline, this._error, this._ranks, this._transport);

    this.node.append(header, form, this._world, this._grid, insert, status, actions, this._stacks);
    this._unsubscribe = _model.subscribe(() => this.render());
    this.render();
  }

  dispose(): void {
    this._unsubscribe();
    super.dispose();
  }

  render(): void {
    const model = this._model;
    const config = model.config;
    const choices = model.choices;
    this._setOptions('framework', model.frameworkChoices().map(choice => [choice.name, choice.title]));
    this._setOptions('backend', plain(choices.backends));
    this._setOptions('launcher', [['', 'auto'], ...plain(choices.launchers)]);
    this._setOptions('ib', plain(choices.ib_modes));
    this._setField('framework', config.framework);
    this._setField('nodes', String(config.nodes));
    this._setField('procs_per_node', config.procs_per_node === null ? '' : String(config.procs_per_node));
    this._setField('backend', config.backend);
    this._setField('launcher', config.launcher ?? '');
    this._setField('hosts', config.hosts.join(','));
    this._setField('ib', config.ib);
    this._setField('timeout', config.timeout === null ? '' : String(config.timeout));

    const world = model.worldSize;
    this._world.textContent =
      world === null
        ? `world size: ${config.nodes} × auto`
        : `world size ${world} (${config.nodes} × ${config.procs_per_node})`;
    this._renderGrid(model.grid());

    this.node.dataset.phase = model.phase;
    this.node.dataset.cluster = model.ready ? model.status.state : '';
    this._headline.textContent = model.headline();
    this._error.textContent = model.lastError ?? '';
    this._transport.textContent = model.transport && model.ready ? `comm over the ${model.transport}` : '';
    this.node.dataset.transport = model.transport ?? '';
    this._ranks.replaceChildren(
      ...model.status.ranks.map(rank =>
        el(
          'li',
          `jp-dist-rank jp-dist-state-${rank.state}`,
          `rank ${rank.rank} (node ${rank.node}, local ${rank.local_rank}${rank.host ? `, ${rank.host}` : ''}): ${rank.state}`
        )
      )
    );
    const state = model.status.state;
    this._buttons.start.disabled = !model.ready || state !== 'stopped';
    this._buttons.stop.disabled = !model.ready || state === 'stopped';
    this._buttons.restart.disabled = !model.ready;
    this._stacksButton.disabled = !model.ready || state === 'stopped' || model.stacksPending;
    this._stacks.textContent = model.stacks ?? '';
    this._stacks.hidden = model.stacks === null;
  }

  private _renderGrid(rows: GridCell[][]): void {
    const table = el('table', 'jp-dist-grid-table');
    const head = table.createTHead().insertRow();
    head.appendChild(el('th', '', 'node'));
    for (const cell of rows[0] ?? []) {
      head.appendChild(el('th', '', `local ${cell.localRank}`));
    }
    const body = table.createTBody();
    for (const row of rows) {
      const tr = body.insertRow();
      tr.appendChild(el('th', '', String(row[0]?.node ?? '')));
      for (const cell of row) {
        const td = el('td', `jp-dist-cell jp-dist-state-${cell.state}`, String(cell.rank));
        td.title = `rank ${cell.rank}${cell.host ? ` on ${cell.host}` : ''}: ${cell.state}`;
        tr.appendChild(td);
      }
    }
    this._grid.replaceChildren(table);
  }

  private _setOptions(key: SelectKey, options: Options): void {
    setOptions(this._fields[key] as HTMLSelectElement, options);
  }

  private _setField(key: keyof RunDefaults, value: string): void {
    const field = this._fields[key];
    if (document.activeElement !== field && field.value !== value) {
      field.value = value;
    }
    field.removeAttribute('aria-invalid');
  }

  private _onField(key: keyof RunDefaults): void {
    const field = this._fields[key];
    const text = field.value;
    let value: unknown;
    switch (key) {
      case 'nodes':
        value = positiveInt(text, false);
        break;
      case 'procs_per_node':
        value = positiveInt(text, true);
        break;
      case 'timeout': {
        const seconds = Number(text);
        value = text.trim() === '' ? null : Number.isFinite(seconds) && seconds > 0 ? seconds : undefined;
        break;
      }
      case 'launcher':
        value = text === '' ? null : text;
        break;
      case 'hosts': {
        const { hosts, bad } = parseHosts(text);
        value = bad.length > 0 ? undefined : hosts;
        break;
      }
      default:
        value = text;
    }
    if (value === undefined) {
      field.setAttribute('aria-invalid', 'true');
      this._error.textContent = `${key}: invalid value ${JSON.stringify(text.slice(0, 40))}`;
      return;
    }
    this._callbacks.update({ [key]: value } as Partial<RunDefaults>);
  }
}
