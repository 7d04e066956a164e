/** The `%%distrun` cell the sidebar inserts, built from its configuration. */

import { RunDefaults, isHost } from './protocol';

export const CELL_COMMENT =
  '# runs on every rank; RANK, LOCAL_RANK and WORLD_SIZE are set for each one';

/** `%%distrun -f pytorch -N 2 -n 2` plus the non-default flags, then a comment line. */
export function distrunCell(config: RunDefaults): string {
  const flags = ['%%distrun', '-f', config.framework, '-N', String(config.nodes)];
  if (config.procs_per_node !== null) {
    flags.push('-n', String(config.procs_per_node));
  }
  if (config.backend !== 'auto') {
    flags.push('--backend', config.backend);
  }
  if (config.launcher !== null) {
    flags.push('--launcher', config.launcher);
  }
  const hosts = config.hosts.filter(isHost);
  if (hosts.length > 0) {
    flags.push('--hosts', hosts.join(','));
  }
  if (config.ib !== 'auto') {
    flags.push('--ib', config.ib);
  }
  if (config.timeout !== null) {
    flags.push('--timeout', String(config.timeout));
  }
  return `${flags.join(' ')}\n${CELL_COMMENT}\n`;
}
