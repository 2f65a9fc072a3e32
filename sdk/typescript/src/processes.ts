import type { Sandbox } from "./sandbox.js";

/** The sandbox's processes (sandbox.processes). */
export class Processes {
  constructor(private readonly sandbox: Sandbox) {}
}
