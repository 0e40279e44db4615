// A real OpenID Provider for the UI's sign-in test: oidc-provider (OpenID
// certified), its development login pages (any login, any password), one
// client (Composer's), and people whose groups the test chooses:
//   node provider.mjs PORT REDIRECT_URI CLIENT_SECRET
// Each login is a person; their groups are given by the login's prefix:
// `admin-…` is in `composer-admins`, `reader-…` in `composer-readers`,
// `billing-…` in `billing-team` (a role in one namespace), any other in
// `interns` (no role in Composer). Prints `ready` once listening.
import Provider from "oidc-provider";

const [port, redirectUri, secret] = process.argv.slice(2);
const PREFIXES = [
  ["admin-", "composer-admins"],
  ["reader-", "composer-readers"],
  ["billing-", "billing-team"],
];
const groupsOf = (login) => [PREFIXES.find(([prefix]) => login.startsWith(prefix))?.[1] ?? "interns"];

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [
    {
      client_id: "composer",
      client_secret: secret,
      redirect_uris: [redirectUri],
      grant_types: ["authorization_code"],
      response_types: ["code"],
      token_endpoint_auth_method: "client_secret_basic",
    },
  ],
  pkce: { methods: ["S256"], required: () => true },
  scopes: ["openid", "email", "groups"],
  claims: { openid: ["sub"], email: ["email", "email_verified"], groups: ["groups"] },
  // The groups go in the ID token itself, as Composer reads them there.
  conformIdTokenClaims: false,
  findAccount: async (_ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, email: `${id}@example.com`, email_verified: true, groups: groupsOf(id) }),
  }),
  features: { devInteractions: { enabled: true } },
});
provider.listen(Number(port), "127.0.0.1", () => console.log("ready"));
