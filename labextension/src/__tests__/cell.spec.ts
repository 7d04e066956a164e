import { CELL_COMMENT, distrunCell } from '../cell';
import { FACTORY_DEFAULTS } from '../model';

describe('the inserted %%distrun cell', () => {
  it('has the framework, nodes and procs, then a comment', () => {
    const text = distrunCell({ ...FACTORY_DEFAULTS, nodes: 2, procs_per_node: 2 });
    expect(text).toBe(`%%distrun -f pytorch -N 2 -n 2\n${CELL_COMMENT}\n`);
    expect(text.split('\n')[1].startsWith('#')).toBe(true);
  });

  it('leaves procs out when auto', () => {
    expect(distrunCell(FACTORY_DEFAULTS).split('\n')[0]).toBe('%%distrun -f pytorch -N 1');
  });

  it('adds only the non-default flags', () => {
    const text = distrunCell({
      framework: 'mpi',
      nodes: 2,
      procs_per_node: 4,
      backend: 'gloo',
      launcher: 'ssh',
      hosts: ['n1', '10.0.0.2'],
      ib: 'off',
      timeout: 60
    });
    expect(text.split('\n')[0]).toBe(
      '%%distrun -f mpi -N 2 -n 4 --backend gloo --launcher ssh --hosts n1,10.0.0.2 --ib off --timeout 60'
    );
  });

  it('never writes a host that is not a host name', () => {
    const text = distrunCell({ ...FACTORY_DEFAULTS, hosts: ['n1', 'x;rm -rf ~'] });
    expect(text.split('\n')[0]).toBe('%%distrun -f pytorch -N 1 --hosts n1');
  });
});
