-- Membership version: every AddMembers that adds someone and every
-- RemoveMember raise it by one under the group row lock that Append takes,
-- and Append returns it with each stored message. A node that receives a
-- batch carrying a version above the last one it applied knows it missed a
-- membership change and re-reads the members it has online before pushing.
ALTER TABLE groups ADD COLUMN member_version bigint NOT NULL DEFAULT 0 CHECK (member_version >= 0);
