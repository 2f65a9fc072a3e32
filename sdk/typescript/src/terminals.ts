import type { Sandbox } from "./sandbox.js";

/** The sandbox's terminals (sandbox.terminals). */
export class Terminals {
  constructor(private readonly sandbox: Sandbox) {}
}
