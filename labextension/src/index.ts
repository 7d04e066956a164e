/** jupyter-dist's JupyterLab plugin: the sidebar, its settings and the insert-cell command. */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { distrunCell } from './cell';
import { NotebookFollower } from './follow';
import { Remembered, SidebarModel } from './model';
import { DistSidebar, SIDEBAR_ID } from './panel';

const PLUGIN_ID = 'jupyter-dist:plugin';

export const CommandIDs = {
  insertCell: 'jupyter-dist:insert-cell',
  open: 'jupyter-dist:open-sidebar'
};

const distIcon = new LabIcon({
  name: 'jupyter-dist:icon',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<rect x="1" y="1" width="6" height="6" rx="1"/><rect x="9" y="1" width="6" height="6" rx="1"/>' +
    '<rect x="1" y="9" width="6" height="6" rx="1"/><rect x="9" y="9" width="6" height="6" rx="1"/>' +
    '</g></svg>'
});

function rememberedFrom(settings: ISettingRegistry.ISettings): Partial<Remembered> {
  const out: Partial<Remembered> = {};
  const framework = settings.get('framework').composite;
  if (typeof framework === 'string' && framework.length > 0) {
    out.framework = framework; // any name: the kernel's welcome says which it offers
  }
  const nodes = settings.get('nodes').composite;
  if (typeof nodes === 'number' && Number.isInteger(nodes) && nodes >= 1) {
    out.nodes = nodes;
  }
  const procs = settings.get('procs_per_node').composite;
  if (procs === null || (typeof procs === 'number' && Number.isInteger(procs) && procs >= 1)) {
    out.procs_per_node = procs;
  }
  return out;
}

/** Save the remembered settings whenever they change (and only then). */
function persist(model: SidebarModel, settings: ISettingRegistry.ISettings): void {
  let saved = JSON.stringify(model.remembered());
  model.subscribe(() => {
    const now = model.remembered();
    const text = JSON.stringify(now);
    if (text !== saved) {
      saved = text;
      for (const [key, value] of Object.entries(now)) {
        if (settings.get(key).composite !== value) {
          settings.set(key, value).catch(reason => console.warn('jupyter-dist: settings', reason));
        }
      }
    }
  });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'A sidebar to configure, start and watch jupyter-dist runs.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ISettingRegistry, ICommandPalette, ILayoutRestorer],
  activate: async (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    registry: ISettingRegistry | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const model = new SidebarModel();
    const follower = new NotebookFollower(tracker, model);

    app.commands.addCommand(CommandIDs.insertCell, {
      label: 'Insert %%distrun cell',
      caption: 'Insert a %%distrun cell below the active cell, with the sidebar settings',
      isEnabled: () => tracker.currentWidget !== null,
      execute: () => {
        const panel = tracker.currentWidget;
        if (!panel) {
          return;
        }
        const notebook = panel.content;
        NotebookActions.insertBelow(notebook);
        if (notebook.activeCell?.model.type !== 'code') {
          NotebookActions.changeCellType(notebook, 'code');
        }
        notebook.activeCell?.model.sharedModel.setSource(distrunCell(model.config));
        app.shell.activateById(panel.id);
      }
    });

    const sidebar = new DistSidebar(model, {
      update: changes => follower.send(model.update(changes)),
      action: action => follower.send(model.action(action)),
      insertCell: () => void app.commands.execute(CommandIDs.insertCell),
      stacks: () => follower.send(model.askStacks())
    });
    sidebar.title.icon = distIcon;
    app.shell.add(sidebar, 'left', { rank: 650 });
    restorer?.add(sidebar, SIDEBAR_ID);

    app.commands.addCommand(CommandIDs.open, {
      label: 'Show the jupyter-dist sidebar',
      execute: () => app.shell.activateById(SIDEBAR_ID)
    });
    palette?.addItem({ command: CommandIDs.insertCell, category: 'jupyter-dist' });
    palette?.addItem({ command: CommandIDs.open, category: 'jupyter-dist' });

    if (registry) {
      try {
        const settings = await registry.load(PLUGIN_ID);
        model.remember(rememberedFrom(settings));
        persist(model, settings);
      } catch (reason) {
        console.warn('jupyter-dist: cannot load settings', reason);
      }
    }
  }
};

export default plugin;
