/** Stand-ins for @jupyterlab/services objects, just what the sidebar uses. */

export class FakeComm {
  opened: unknown[] = [];
  sent: unknown[] = [];
  isDisposed = false;
  commsOverSubshells = 'perCommTarget';
  subshellId: string | null = null;
  onMsg: (msg: unknown) => void = () => undefined;
  onClose: (msg: unknown) => void = () => undefined;
  subshellStarted: Promise<void>;
  private _resolve!: () => void;

  constructor() {
    this.subshellStarted = new Promise(resolve => (this._resolve = resolve));
  }
  startSubshell(id: string): void {
    this.subshellId = id;
    this._resolve();
  }
  open(data: unknown): void {
    this.opened.push(data);
  }
  send(data: unknown): void {
    this.sent.push(data);
  }
  close(): void {
    this.isDisposed = true;
  }
  reply(data: unknown): void {
    this.onMsg({ content: { data } });
  }
}

export class FakeKernel {
  isDisposed = false;
  info = Promise.resolve({});
  comms: FakeComm[] = [];
  targets = new Map<string, () => void>();
  constructor(public supportsSubshells: boolean) {}
  createComm(): FakeComm {
    const comm = new FakeComm();
    this.comms.push(comm);
    return comm;
  }
  registerCommTarget(name: string, cb: () => void): void {
    this.targets.set(name, cb);
  }
  removeCommTarget(name: string): void {
    this.targets.delete(name);
  }
}
