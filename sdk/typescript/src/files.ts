import type { Sandbox } from "./sandbox.js";

/** The sandbox's files (sandbox.files). */
export class Files {
  constructor(private readonly sandbox: Sandbox) {}
}
